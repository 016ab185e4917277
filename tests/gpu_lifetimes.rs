//! GPU work keeps what it uses alive: a buffer, a stream, a pooled staging buffer, a timer
//! and a kernel dropped by their owner while a submission that uses them is still in flight
//! stay valid until it completes (the validation layers report any use after destruction,
//! e.g. VUID-vkDestroyBuffer-buffer-00922, as an error, which fails these tests). And at the
//! engine level: a streaming join whose consumer gives up while batches are in flight, and
//! the engine dropped right after. On lavapipe with validation on.
#![cfg(feature = "gpu")]

mod common;

use common::{assert_no_validation_errors, in_own_process, shared_context};
use simjoin::vk::{shaders, Buffer, GpuTimer, KernelSpec, Memory, StagingPool, Stream};
use simjoin::{Algorithm, Backend, Dataset, Engine, ErrorKind, JoinOptions, Pair};
use std::sync::Arc;

const N: u64 = 1 << 22; // enough work that the host drops things before the GPU is done

#[test]
fn buffer_and_kernel_dropped_while_in_flight() {
    let ctx = shared_context();
    let iota = ctx
        .kernel(
            "iota",
            shaders::IOTA,
            &KernelSpec::new(64).bindings(1).push_bytes(8),
        )
        .unwrap();
    let data = Buffer::new(&ctx, N * 4, Memory::Device, "in flight").unwrap();
    let copy = Buffer::new(&ctx, 16, Memory::Readback, "copy").unwrap();
    let mut s = Stream::new(&ctx, 0).unwrap();
    s.dispatch_threads(
        &iota,
        N,
        &[data.all()],
        bytemuck::cast_slice(&[N as u32, 7]),
    )
    .unwrap();
    s.barrier().unwrap();
    s.copy(&data, (N - 4) * 4, &copy, 0, 16).unwrap();
    let ticket = s.submit().unwrap();
    // The only handles the caller has: gone while the kernel and the copy may still run.
    let weak = Arc::downgrade(&data);
    drop(data);
    drop(iota);
    assert!(
        weak.upgrade().is_some() || ticket.is_done().unwrap(),
        "the stream holds the buffer until its work is done"
    );
    ticket.wait().unwrap();
    let last = N as u32 - 4 + 7;
    assert_eq!(
        copy.read_vec::<u32>(0, 4).unwrap(),
        vec![last, last + 1, last + 2, last + 3]
    );
    // Once the frame is recycled (next recording on this stream), the buffer is freed.
    s.fill(&copy, 0, 4, 0).unwrap();
    s.finish().unwrap();
    s.fill(&copy, 0, 4, 0).unwrap();
    s.finish().unwrap();
    assert!(weak.upgrade().is_none(), "freed after the work completed");
    assert_no_validation_errors();
}

#[test]
fn stream_and_timer_dropped_while_in_flight() {
    let ctx = shared_context();
    let iota = ctx
        .kernel(
            "iota",
            shaders::IOTA,
            &KernelSpec::new(64).bindings(1).push_bytes(8),
        )
        .unwrap();
    let data = Buffer::new(&ctx, N * 4, Memory::Device, "data").unwrap();
    let timer = GpuTimer::new(&ctx, 2).ok();
    let mut s = Stream::new(&ctx, 1).unwrap();
    if let Some(t) = &timer {
        s.timestamp(t, 0).unwrap();
    }
    s.dispatch_threads(
        &iota,
        N,
        &[data.all()],
        bytemuck::cast_slice(&[N as u32, 1]),
    )
    .unwrap();
    if let Some(t) = &timer {
        s.timestamp(t, 1).unwrap();
    }
    let ticket = s.submit().unwrap();
    drop(timer);
    drop(s); // waits for its work: command buffers and descriptor sets are freed after
    assert!(ticket.is_done().unwrap());
    ticket.wait().unwrap();
    assert_eq!(ctx.download::<u32>(&data, 5, 1).unwrap(), vec![6]);
    assert_no_validation_errors();
}

#[test]
fn pooled_buffer_is_not_lent_again_while_in_flight() {
    let ctx = shared_context();
    let pool = StagingPool::new(&ctx);
    let src = Buffer::new(&ctx, 1 << 20, Memory::Device, "src").unwrap();
    let mut s = Stream::new(&ctx, 0).unwrap();
    s.fill(&src, 0, 1 << 20, 0xABCD).unwrap();
    s.barrier().unwrap();
    let staging = pool.acquire(1 << 20, Memory::Readback).unwrap();
    let first = staging.raw();
    s.copy(&src, 0, &staging, 0, 1 << 20).unwrap();
    let ticket = s.submit().unwrap();
    drop(staging); // still held by the stream's frame: not idle
    let again = pool.acquire(1 << 20, Memory::Readback).unwrap();
    if !ticket.is_done().unwrap() {
        assert_ne!(again.raw(), first, "a buffer in use was lent again");
    }
    ticket.wait().unwrap();
    drop(again);
    assert_no_validation_errors();
}

#[test]
fn streaming_consumer_gives_up_while_batches_are_in_flight() {
    if !in_own_process("streaming_consumer_gives_up_while_batches_are_in_flight") {
        return; // ran in a child process: it creates and destroys Vulkan devices
    }
    common::gpu_test_setup();
    let mut rng = common::Rng(11);
    let x: Vec<f32> = (0..20_000 * 2).map(|_| rng.unit() as f32).collect();
    let data = Dataset::from_f32(&x, 2).unwrap();
    let mut o = JoinOptions::new(0.02);
    o.backend = Backend::Gpu;
    o.algorithm = Algorithm::Grid;
    o.result_buffer_pairs = Some(500); // many batches in flight at once
    for _ in 0..3 {
        let engine = Engine::new();
        let mut chunks = 0;
        let mut give_up = |_: &[Pair]| -> anyhow::Result<()> {
            chunks += 1;
            anyhow::bail!("consumer gone")
        };
        let e = engine
            .self_join_stream(&data, &o, &mut give_up)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
        assert_eq!(chunks, 1);
        drop(engine); // with its device: nothing of the join may still be running
    }
    assert_no_validation_errors();
}
