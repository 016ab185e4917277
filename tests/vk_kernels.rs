//! The Vulkan layer on lavapipe with validation on: context, buffers, kernels, streams, and
//! the sort and scan kernels against CPU references. A validation error fails every test.

mod common;

use common::{assert_no_validation_errors, gpu_test_setup, shared_context};
use simjoin::vk::{
    self, shaders, Buffer, Context, ContextOptions, KernelSpec, Memory, StagingPool, Stream,
};
use simjoin::ErrorKind;

fn iota_kernel(ctx: &std::sync::Arc<Context>, workgroup: u32) -> vk::Kernel {
    ctx.kernel(
        "iota",
        shaders::IOTA,
        &KernelSpec::new(workgroup).bindings(1).push_bytes(8),
    )
    .unwrap()
}

#[test]
fn context_on_lavapipe() {
    let ctx = shared_context();
    assert!(
        ctx.device_name().to_lowercase().contains("llvmpipe"),
        "{}",
        ctx.device_name()
    );
    assert!(ctx.is_software());
    assert!(ctx.has_unified_memory());
    let l = ctx.limits();
    assert_eq!(l.max_storage_buffer_range, 128 << 20);
    assert!(l.max_compute_work_group_count[0] >= 65535);
    assert!(l.subgroup_size >= 1);
    assert!(ctx.compute_queue_count() >= 1);
    assert!(ctx.features().shader_float64);
    assert_no_validation_errors();
}

#[test]
fn devices_lists_lavapipe() {
    gpu_test_setup();
    let devices = simjoin::devices().unwrap();
    let lvp = devices
        .iter()
        .find(|d| d.name.contains("llvmpipe"))
        .expect("lavapipe listed");
    assert_eq!(lvp.kind, "cpu");
    assert!(lvp.api_version.starts_with("1."));
    assert!(lvp
        .details
        .iter()
        .any(|l| l.contains("maxStorageBufferRange")));
    assert!(lvp.details.iter().any(|l| l == "usable by simjoin: yes"));
    assert_no_validation_errors();
}

#[test]
fn device_selection_by_index_and_name() {
    gpu_test_setup();
    let by_name = Context::new(&ContextOptions {
        device: Some("LLVMPIPE".into()),
        validation: None,
    })
    .unwrap();
    assert!(by_name.device_name().contains("llvmpipe"));
    let index = simjoin::devices()
        .unwrap()
        .iter()
        .find(|d| d.name.contains("llvmpipe"))
        .unwrap()
        .index;
    let by_index = Context::new(&ContextOptions {
        device: Some(index.to_string()),
        validation: None,
    })
    .unwrap();
    assert_eq!(by_index.device_name(), by_name.device_name());
    let missing = Context::new(&ContextOptions {
        device: Some("no such gpu".into()),
        validation: None,
    })
    .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NoDevice);
    assert!(missing.to_string().contains("no such gpu"), "{missing}");
    let bad_index = Context::new(&ContextOptions {
        device: Some("99".into()),
        validation: None,
    })
    .unwrap_err();
    assert_eq!(bad_index.kind(), ErrorKind::NoDevice);
    drop((by_name, by_index));
    assert_no_validation_errors();
}

#[test]
fn buffers_mapped_upload_download_and_staging_copies() {
    let ctx = shared_context();
    let data: Vec<u32> = (0..10_007).map(|i| i * 7 + 1).collect();
    // Zero-copy path (lavapipe memory is device-local and mapped).
    let dev = ctx.upload(&data, "data").unwrap();
    assert!(dev.is_mapped());
    assert_eq!(ctx.download::<u32>(&dev, 0, data.len()).unwrap(), data);
    assert_eq!(ctx.download::<u32>(&dev, 5, 3).unwrap(), &data[5..8]);
    // Staging path: upload buffer -> device buffer -> read-back buffer by queue copies.
    let pool = StagingPool::new(&ctx);
    let up = pool.acquire(40_028, Memory::Upload).unwrap();
    up.write(0, &data).unwrap();
    let mid = Buffer::new(&ctx, 40_028, Memory::Device, "mid").unwrap();
    let down = pool.acquire(40_028, Memory::Readback).unwrap();
    let mut s = Stream::new(&ctx, 0).unwrap();
    s.copy(&up, 0, &mid, 0, 40_028).unwrap();
    s.barrier().unwrap();
    s.copy(&mid, 8, &down, 0, 40_020).unwrap();
    s.finish().unwrap();
    assert_eq!(down.read_vec::<u32>(0, 10_005).unwrap(), &data[2..]);
    // Pooled buffers come back and are reused.
    drop((up, down));
    assert_eq!(pool.idle_count(), 2);
    let again = pool.acquire(1000, Memory::Upload).unwrap();
    assert!(again.size() >= 40_028, "reused the pooled upload buffer");
    assert_eq!(pool.idle_count(), 1);
    // Empty data works.
    let empty = ctx.upload::<u32>(&[], "empty").unwrap();
    assert_eq!(empty.size(), 0);
    assert!(ctx.download::<u32>(&empty, 0, 0).unwrap().is_empty());
    assert_no_validation_errors();
}

#[test]
fn bad_buffer_access_is_a_clear_error() {
    let ctx = shared_context();
    let b = Buffer::new(&ctx, 16, Memory::Device, "small").unwrap();
    assert_eq!(
        b.write(3, &[1u32, 2]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        b.read_vec::<u32>(0, 5).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let mut s = Stream::new(&ctx, 0).unwrap();
    assert_eq!(
        s.copy(&b, 8, &b, 0, 16).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.fill(&b, 2, 4, 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let huge = Buffer::new(&ctx, u64::MAX / 2, Memory::Device, "huge").unwrap_err();
    assert_eq!(huge.kind(), ErrorKind::OutOfDeviceMemory);
    let pool = StagingPool::new(&ctx);
    assert!(pool.acquire(4, Memory::Device).is_err());
    assert_no_validation_errors();
}

#[test]
fn kernel_dispatch_and_argument_checks() {
    let ctx = shared_context();
    let iota = iota_kernel(&ctx, 64);
    let n = 1000u32;
    let out = Buffer::new(&ctx, n as u64 * 4, Memory::Device, "out").unwrap();
    let mut s = Stream::new(&ctx, 0).unwrap();
    s.dispatch_threads(
        &iota,
        n as u64,
        &[out.all()],
        bytemuck::cast_slice(&[n, 10u32]),
    )
    .unwrap();
    s.finish().unwrap();
    let expect: Vec<u32> = (10..10 + n).collect();
    assert_eq!(ctx.download::<u32>(&out, 0, n as usize).unwrap(), expect);
    // A window of a buffer, bound with an offset.
    s.dispatch_threads(
        &iota,
        100,
        &[out.slice(256, 400)],
        bytemuck::cast_slice(&[100u32, 5000]),
    )
    .unwrap();
    s.finish().unwrap();
    let got = ctx.download::<u32>(&out, 63, 3).unwrap();
    assert_eq!(got, vec![10 + 63, 5000, 5001]);
    // Wrong argument counts and sizes are errors, not undefined behaviour.
    let params = [n, 0u32];
    let push = bytemuck::cast_slice(&params);
    assert_eq!(
        s.dispatch_threads(&iota, 4, &[], push).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.dispatch_threads(&iota, 4, &[out.all()], &[0; 4])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.dispatch_threads(&iota, 4, &[out.slice(3996, 8)], push)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.dispatch_threads(&iota, 4, &[out.slice(4, 8)], push)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.dispatch(&iota, [1 << 31, 1, 1], &[out.all()], push)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    let too_wide = ctx.kernel(
        "iota",
        shaders::IOTA,
        &KernelSpec::new(1 << 20).bindings(1).push_bytes(8),
    );
    assert_eq!(too_wide.unwrap_err().kind(), ErrorKind::Unsupported);
    s.finish().unwrap();
    assert_no_validation_errors();
}

#[test]
fn dispatch_beyond_max_workgroup_count_uses_a_2d_grid() {
    let ctx = shared_context();
    // Workgroups of 1 so that a modest thread count exceeds maxComputeWorkGroupCount[0].
    let iota = iota_kernel(&ctx, 1);
    let n = ctx.limits().max_compute_work_group_count[0] as u64 + 1234;
    let mut s = Stream::new(&ctx, 0).unwrap();
    assert_eq!(s.grid_for(&iota, n).unwrap()[1], 2);
    let out = Buffer::new(&ctx, n * 4, Memory::Device, "out").unwrap();
    s.dispatch_threads(
        &iota,
        n,
        &[out.all()],
        bytemuck::cast_slice(&[n as u32, 0u32]),
    )
    .unwrap();
    s.finish().unwrap();
    let got = ctx.download::<u32>(&out, 0, n as usize).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == i as u32));
    assert_no_validation_errors();
}

#[test]
fn streams_chain_across_queues_with_tickets() {
    let ctx = shared_context();
    let n = 4096u32;
    let a = Buffer::new(&ctx, n as u64 * 4, Memory::Device, "a").unwrap();
    let b = Buffer::new(&ctx, n as u64 * 4, Memory::Device, "b").unwrap();
    let iota = iota_kernel(&ctx, 128);
    let mut compute = Stream::new(&ctx, 1).unwrap();
    let mut copier = Stream::transfer(&ctx).unwrap();
    let mut last = Stream::new(&ctx, 2).unwrap();
    compute
        .dispatch_threads(
            &iota,
            n as u64,
            &[a.all()],
            bytemuck::cast_slice(&[n, 1u32]),
        )
        .unwrap();
    let t1 = compute.submit().unwrap();
    copier.wait_for(&t1);
    copier.copy(&a, 0, &b, 0, n as u64 * 4).unwrap();
    let t2 = copier.submit().unwrap();
    last.wait_for(&t2);
    last.fill(&a, 0, 16, 0xdead).unwrap();
    let t3 = last.submit().unwrap();
    t3.wait().unwrap();
    assert!(t1.is_done().unwrap() && t2.is_done().unwrap());
    let got_b = ctx.download::<u32>(&b, 0, n as usize).unwrap();
    assert!(got_b.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
    assert_eq!(
        ctx.download::<u32>(&a, 0, 5).unwrap(),
        vec![0xdead, 0xdead, 0xdead, 0xdead, 5]
    );
    // Consecutive submissions of one stream run in order; frames are recycled.
    for round in 0..5u32 {
        compute
            .dispatch_threads(
                &iota,
                n as u64,
                &[a.all()],
                bytemuck::cast_slice(&[n, round * 100]),
            )
            .unwrap();
        compute.submit().unwrap();
    }
    compute.last_ticket().wait().unwrap();
    assert_eq!(ctx.download::<u32>(&a, 7, 1).unwrap(), vec![407]);
    // An empty submission still yields a ticket.
    copier.submit().unwrap().wait().unwrap();
    assert_no_validation_errors();
}

#[test]
fn context_is_shared_across_threads() {
    let ctx = shared_context();
    let iota = iota_kernel(&ctx, 64);
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let ctx = ctx.clone();
            let iota = iota.clone();
            scope.spawn(move || {
                let mut s = Stream::new(&ctx, t as usize).unwrap();
                let out = Buffer::new(&ctx, 4 * 5000, Memory::Device, "out").unwrap();
                for round in 0..3u32 {
                    let start = t * 1_000_000 + round;
                    s.dispatch_threads(
                        &iota,
                        5000,
                        &[out.all()],
                        bytemuck::cast_slice(&[5000u32, start]),
                    )
                    .unwrap();
                    s.finish().unwrap();
                    let got = ctx.download::<u32>(&out, 0, 5000).unwrap();
                    assert!(got.iter().enumerate().all(|(i, &v)| v == start + i as u32));
                }
            });
        }
    });
    assert_no_validation_errors();
}

#[test]
fn buffers_larger_than_max_storage_buffer_range() {
    let ctx = shared_context();
    let range = ctx.limits().max_storage_buffer_range;
    let size = range + (32 << 20);
    let big = Buffer::new(&ctx, size, Memory::Device, "big").unwrap();
    let iota = iota_kernel(&ctx, 64);
    let mut s = Stream::new(&ctx, 0).unwrap();
    // Binding the whole buffer is refused with a clear error ...
    let params = [16u32, 0];
    let push = bytemuck::cast_slice(&params);
    let err = s
        .dispatch_threads(&iota, 16, &[big.all()], push)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("maxStorageBufferRange"), "{err}");
    // ... while windows past the limit work.
    let tail = size - 4096;
    s.dispatch_threads(
        &iota,
        1024,
        &[big.slice(tail, 4096)],
        bytemuck::cast_slice(&[1024u32, 77]),
    )
    .unwrap();
    s.fill(&big, 0, 8, 3).unwrap();
    s.finish().unwrap();
    assert_eq!(
        ctx.download::<u32>(&big, (tail / 4) as usize + 1023, 1)
            .unwrap(),
        vec![77 + 1023]
    );
    assert_eq!(ctx.download::<u32>(&big, 0, 2).unwrap(), vec![3, 3]);
    assert!(big.device_address() != 0);
    assert_no_validation_errors();
}
