//! Reproduces the Vulkan loader race behind the rare SIGSEGV of the GPU test binaries
//! (issue: "the vk_kernels test binary died with SIGSEGV"), with raw ash calls and no
//! simjoin code: threads that create and destroy Vulkan devices at the same time.
//! The loader's `loader_get_icd_and_device()` walks each driver's `logical_device_list`
//! under a lock while `loader_add_logical_device()` / `loader_remove_logical_device()` edit
//! and free its nodes without one (KhronosGroup/Vulkan-Loader#2018), so a vkCreateDevice
//! (which resolves the dispatch table through vkGetDeviceProcAddr: ash's `Device::load`
//! makes hundreds of such calls) racing a vkDestroyDevice reads a freed node.
//! simjoin therefore creates and destroys devices under one process-wide lock
//! (`vk::context::DEVICE_LIFECYCLE`).
//!
//!     VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json \
//!         cargo run --release --example loader_race -- [threads] [rounds] [locked]
//!
//! `locked` takes the same lock simjoin does around create and destroy: then it never crashes.

use ash::vk;
use std::sync::Mutex;

static LOCK: Mutex<()> = Mutex::new(());

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200);
    let locked = args.get(3).is_some_and(|a| a == "locked");
    // SAFETY: loads the system Vulkan loader; no preconditions.
    let entry = unsafe { ash::Entry::load() }.expect("Vulkan loader");
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a valid create info.
    let instance = unsafe { entry.create_instance(&info, None) }.expect("instance");
    // SAFETY: a live instance.
    let physical = unsafe { instance.enumerate_physical_devices() }.expect("devices")[0];
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..rounds {
                    let priorities = [1.0f32];
                    let queues = [vk::DeviceQueueCreateInfo::default()
                        .queue_family_index(0)
                        .queue_priorities(&priorities)];
                    let dinfo = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
                    let guard = locked.then(|| LOCK.lock().unwrap());
                    // SAFETY: family 0 with one queue exists on every Vulkan device.
                    let device =
                        unsafe { instance.create_device(physical, &dinfo, None) }.expect("device");
                    drop(guard);
                    let guard = locked.then(|| LOCK.lock().unwrap());
                    // SAFETY: the device is idle and owns nothing.
                    unsafe { device.destroy_device(None) };
                    drop(guard);
                }
            });
        }
    });
    // SAFETY: every device made from it is destroyed.
    unsafe { instance.destroy_instance(None) };
    println!(
        "{threads} threads x {rounds} device create/destroy rounds ({}): no crash",
        if locked { "locked" } else { "unlocked" }
    );
}
