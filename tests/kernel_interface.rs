//! The join kernels' interface has one definition, `src/gpu/interface.rs`; build.rs
//! generates the GLSL the kernels include from it. This test checks what compiled kernels
//! really see: a kernel built from the join kernels' own declarations
//! (glsl/interface_echo.glsl includes glsl/join_common.glsl) echoes every push-constant
//! field, every flag and the first element of every binding, and each must equal what the
//! Rust side sent or defines. A flag, binding number or parameter changed on one side only
//! (say a kernel that defines its own FLAG_SWAP, or a hand-edited header) fails it; so does
//! a layout disagreement between `JoinParams<T>` and the GLSL block (f64 alignment).
//! On lavapipe with validation on.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, shared_context};
use simjoin::kernel_interface::{binding, flags, glsl_header, JoinParams};
use simjoin::vk::{shaders, Buffer, Context, KernelSpec, Stream};
use std::sync::Arc;

/// Bits of a coordinate as the kernel's TBITS writes them: [low word, high word].
trait Bits: Copy + bytemuck::Pod {
    fn bits(self) -> [u32; 2];
    fn from_f64(x: f64) -> Self;
}
impl Bits for f32 {
    fn bits(self) -> [u32; 2] {
        [self.to_bits(), 0]
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl Bits for f64 {
    fn bits(self) -> [u32; 2] {
        let b = self.to_bits();
        [b as u32, (b >> 32) as u32]
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// One buffer per binding, each holding a tag that says which binding it is.
fn tagged_buffers<T: Bits>(ctx: &Arc<Context>) -> Vec<Arc<Buffer>> {
    binding::ALL
        .iter()
        .map(|&(name, index)| {
            let tag = 1000 + index;
            let bytes: Vec<u8> = match name {
                "R_DOT" | "Q_DOT" => bytemuck::cast_slice(&[tag as f32; 4]).to_vec(),
                "R_COORDS" | "Q_COORDS" | "Q_LIMITS" => {
                    bytemuck::cast_slice(&[T::from_f64(tag as f64); 4]).to_vec()
                }
                "CELL_KEYS" => bytemuck::cast_slice(&[(7u64 << 32) | tag as u64; 2]).to_vec(),
                "STATES" => vec![0u8; 16 * 16],
                _ => bytemuck::cast_slice(&[tag; 4]).to_vec(),
            };
            ctx.upload(&bytes, name).unwrap()
        })
        .collect()
}

fn echo<T: Bits>(spirv: &[u8]) -> (JoinParams<T>, Vec<[u32; 4]>, Vec<Arc<Buffer>>)
where
    JoinParams<T>: bytemuck::Pod,
{
    let ctx = shared_context();
    let spec = KernelSpec::new(1)
        .bindings(binding::COUNT)
        .push_bytes(std::mem::size_of::<JoinParams<T>>() as u32)
        .constant(1, 3) // DIM
        .constant(2, 1) // K
        .constant(3, 0) // METRIC
        .constant(4, 0); // SORT_DIM
    let kernel = ctx.kernel("interface_echo", spirv, &spec).unwrap();
    let params = JoinParams::<T> {
        q_begin: 11,
        q_count: 12,
        q_stride: 13,
        capacity: 14,
        flags: 15,
        n_cells: 16,
        budget: 17,
        log_cells: 18,
        lists: 19,
        shift: 20,
        radius: 21,
        rank_lo: 22,
        rank_hi: 23,
        k: 24,
        stop_lo: 25,
        stop_hi: 26,
        lanes: 27,
        reserved: 28,
        thr: T::from_f64(0.1),
        window: T::from_f64(-2.5e-7),
        thr_reject: T::from_f64(3.75),
        dot_cutoff: T::from_f64(0.0625),
    };
    let buffers = tagged_buffers::<T>(&ctx);
    let ranges: Vec<_> = buffers.iter().map(|b| b.all()).collect();
    let mut stream = Stream::new(&ctx, 0).unwrap();
    stream
        .dispatch_threads(&kernel, 1, &ranges, bytemuck::bytes_of(&params))
        .unwrap();
    stream.finish().unwrap();
    let states = &buffers[binding::STATES as usize];
    let seen: Vec<[u32; 4]> = ctx.download(states, 0, 16).unwrap();
    (params, seen, buffers)
}

fn check<T: Bits>(spirv: &[u8])
where
    JoinParams<T>: bytemuck::Pod,
{
    let (p, seen, buffers) = echo::<T>(spirv);
    assert_eq!(seen[0], [p.q_begin, p.q_count, p.q_stride, p.capacity]);
    assert_eq!(seen[1], [p.flags, p.n_cells, p.budget, p.log_cells]);
    let (thr, window, reject) = (p.thr.bits(), p.window.bits(), p.thr_reject.bits());
    assert_eq!(
        seen[2],
        [thr[0], thr[1], window[0], window[1]],
        "thr, window"
    );
    assert_eq!(seen[3][..2], reject, "thr_reject");
    assert_eq!(seen[3][2..], p.dot_cutoff.bits(), "dot_cutoff");
    // Flags: the compiled kernel's values are Rust's.
    assert_eq!(
        seen[4],
        [
            flags::FLAG_SELF,
            flags::FLAG_COUNT,
            flags::FLAG_SWAP,
            flags::FLAG_SORTIDU
        ],
        "flags as the kernel sees them"
    );
    assert_eq!(
        seen[5][..2],
        [flags::FLAG_REORDER, flags::FLAG_DOT_FILTER],
        "FLAG_REORDER, FLAG_DOT_FILTER"
    );
    assert_eq!(seen[5][2..], [p.stop_lo, p.stop_hi], "stop_lo, stop_hi");
    assert_eq!(
        seen[10],
        [p.lists, p.shift, p.radius, p.rank_lo],
        "lists, shift, radius, rank_lo"
    );
    assert_eq!(
        seen[11],
        [p.rank_hi, p.k, flags::FLAG_KNN, flags::FLAG_Q_IDS],
        "rank_hi, k, FLAG_KNN, FLAG_Q_IDS"
    );
    assert_eq!(seen[13][2], flags::FLAG_LINK, "FLAG_LINK");
    assert_eq!(seen[13][3], flags::FLAG_TILE, "FLAG_TILE");
    assert_eq!(
        seen[14][..3],
        [flags::FLAG_ROWS, flags::FLAG_ABOVE, flags::FLAG_NOT_SELF],
        "FLAG_ROWS, FLAG_ABOVE, FLAG_NOT_SELF"
    );
    assert_eq!(
        [seen[14][3], seen[15][0]],
        [p.lanes, p.reserved],
        "lanes, reserved"
    );
    assert_eq!(flags::ALL.len(), 13, "a new flag needs a line in this test");
    // Bindings: each GLSL buffer reads the buffer Rust bound at its binding number.
    let tag = |b: u32| 1000 + b;
    let coord = |b: u32| T::from_f64(tag(b) as f64).bits();
    assert_eq!(seen[6][..2], coord(binding::R_COORDS), "R_COORDS");
    assert_eq!(seen[6][2..], coord(binding::Q_COORDS), "Q_COORDS");
    assert_eq!(seen[7][..2], [tag(binding::CELL_KEYS), 7], "CELL_KEYS");
    assert_eq!(seen[7][2], tag(binding::CELL_RANGES), "CELL_RANGES");
    assert_eq!(
        seen[8],
        [
            tag(binding::R_IDS),
            tag(binding::Q_IDS),
            tag(binding::Q_CELLS),
            tag(binding::META)
        ],
        "R_IDS, Q_IDS, Q_CELLS, META"
    );
    assert_eq!(seen[9][0], tag(binding::COUNTERS), "COUNTERS");
    let f32_tag = |b: u32| (tag(b) as f32).to_bits();
    assert_eq!(seen[9][1], f32_tag(binding::R_DOT), "R_DOT");
    assert_eq!(seen[9][2], f32_tag(binding::Q_DOT), "Q_DOT");
    assert_eq!(seen[12][..2], coord(binding::Q_LIMITS), "Q_LIMITS");
    assert_eq!(seen[12][2], tag(binding::Q_RADII), "Q_RADII");
    assert_eq!(seen[13][0], tag(binding::LINK_CORE), "LINK_CORE");
    assert_eq!(seen[13][1], tag(binding::LINK_PARENT), "LINK_PARENT");
    let ctx = shared_context();
    let results: Vec<u32> = ctx
        .download(&buffers[binding::RESULTS as usize], 0, 2)
        .unwrap();
    assert_eq!(results, [0x5EE0, 0x5EE1], "RESULTS");
    assert_eq!(
        binding::COUNT,
        17,
        "a new binding needs a line in this test"
    );
}

#[test]
fn f32_kernels_see_the_rust_interface() {
    check::<f32>(shaders::INTERFACE_ECHO_F32);
    assert_no_validation_errors();
}

#[test]
fn f64_kernels_see_the_rust_interface() {
    check::<f64>(shaders::INTERFACE_ECHO_F64);
    assert_no_validation_errors();
}

/// No kernel source defines the interface on its own: flags, binding numbers of the join
/// buffers and the push-constant block come only from the generated header.
#[test]
fn kernels_take_the_interface_from_the_generated_header() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("glsl");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("join_")
            || name.starts_with("grid_join")
            || name.starts_with("brute_join")
            || name == "lss.glsl"
            || name.starts_with("lss_f"))
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (flag, _) in flags::ALL {
            assert!(
                !text.contains(&format!("uint {flag} ="))
                    && !text.contains(&format!("define {flag}")),
                "{name} defines {flag} itself"
            );
        }
        assert!(
            !text.contains("push_constant"),
            "{name} declares its own push constants"
        );
        assert!(
            !text.contains("binding = 0") && !text.contains("binding = 1"),
            "{name} numbers a binding itself"
        );
    }
    let header = glsl_header();
    for (flag, value) in flags::ALL {
        assert!(
            header.contains(&format!("const uint {flag} = {value}u;")),
            "{header}"
        );
    }
}

#[test]
fn binding_numbers_are_dense_and_ordered() {
    for (i, (_, b)) in binding::ALL.iter().enumerate() {
        assert_eq!(*b as usize, i);
    }
}
