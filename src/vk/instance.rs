//! The Vulkan instance: the loader, the instance itself and, with validation, the Khronos
//! layer and a debug messenger that counts validation errors. [`Instance`] owns them and
//! destroys them in reverse order when dropped.

use super::{vkr, VALIDATION_ERRORS, VALIDATION_WARNINGS};
use crate::error::{Error, ErrorKind, Result};
use ash::vk;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Held while a Vulkan instance or device is created, enumerated or destroyed,
/// process-wide. These calls are not safe to make from several threads at once with the
/// loader and drivers users have: the Vulkan loader edits its list of logical devices
/// without a lock while lookups walk it (KhronosGroup/Vulkan-Loader#2018, still so in
/// 1.4.341; Debian 12 ships 1.3.239), and lavapipe builds an llvmpipe screen (with
/// process-wide LLVM and gallivm initialisation) for every instance that enumerates its
/// devices. Serialising them costs nothing measurable: they take milliseconds, once per
/// engine. Re-entrant on one thread (a failure part-way through a creation drops what was
/// made while the lock is held).
pub(crate) struct LifecycleGuard(Option<std::sync::MutexGuard<'static, ()>>);

thread_local! {
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub(crate) fn lifecycle_lock() -> LifecycleGuard {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if HOLDING.with(|h| h.get()) {
        return LifecycleGuard(None);
    }
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    HOLDING.with(|h| h.set(true));
    LifecycleGuard(Some(guard))
}

impl Drop for LifecycleGuard {
    fn drop(&mut self) {
        if self.0.take().is_some() {
            HOLDING.with(|h| h.set(false));
        }
    }
}

/// The debug messenger's callback.
///
/// # Safety
/// Called by the validation layer with `data` NULL or pointing at a valid callback-data
/// struct whose `p_message` is NULL or a NUL-terminated string, live during the call.
unsafe extern "system" fn debug_callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: per this function's contract, `data` and its message are valid when not NULL.
    let message = unsafe {
        if data.is_null() || (*data).p_message.is_null() {
            "(no message)".into()
        } else {
            CStr::from_ptr((*data).p_message).to_string_lossy()
        }
    };
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        VALIDATION_ERRORS.fetch_add(1, Ordering::SeqCst);
        eprintln!("[vulkan validation ERROR] {message}");
    } else if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING) {
        VALIDATION_WARNINGS.fetch_add(1, Ordering::SeqCst);
        eprintln!("[vulkan validation warning] {message}");
    }
    vk::FALSE
}

/// What the debug messenger reports: errors and warnings, to `debug_callback`.
fn messenger_info() -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(debug_callback))
}

/// The Vulkan loader, loaded once per process and kept: unloading and reloading it with
/// every engine would cost a `dlopen` each time, and the loader (and the drivers it keeps
/// open) hold process-wide state that is not meant to be torn down while the process runs.
pub(super) fn load_entry() -> Result<ash::Entry> {
    static ENTRY: std::sync::OnceLock<std::result::Result<ash::Entry, String>> =
        std::sync::OnceLock::new();
    ENTRY
        .get_or_init(|| {
            // SAFETY: loads the system's Vulkan loader (libvulkan.so.1), whose
            // initialisation has no preconditions; the static keeps it loaded.
            unsafe { ash::Entry::load() }.map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| {
            Error::new(
                ErrorKind::NoDevice,
                format!("cannot load the Vulkan loader (libvulkan.so.1): {e}"),
            )
        })
}

fn create_instance(entry: &ash::Entry, validation: bool) -> Result<ash::Instance> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"simjoin")
        .engine_name(c"simjoin")
        .api_version(vk::API_VERSION_1_2);
    let mut layers: Vec<*const c_char> = Vec::new();
    let mut extensions: Vec<*const c_char> = Vec::new();
    if validation {
        // SAFETY: a plain query of the loader.
        let available = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(vkr("listing instance layers"))?;
        let found = available
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
        if !found {
            return Err(Error::unsupported(
                "SIMJOIN_VALIDATION is set but the Khronos validation layer (VK_LAYER_KHRONOS_validation) \
                 is not installed (Debian: apt install vulkan-validationlayers)",
            ));
        }
        layers.push(VALIDATION_LAYER.as_ptr());
        extensions.push(ash::ext::debug_utils::NAME.as_ptr());
    }
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&extensions);
    // Also report problems of instance creation and destruction themselves.
    let mut creation_messenger = messenger_info();
    if validation {
        info = info.push_next(&mut creation_messenger);
    }
    // SAFETY: `info` and everything it points to (names, application info, messenger
    // info) live until the call returns; the layer was found above.
    unsafe { entry.create_instance(&info, None) }.map_err(|r| {
        let mut e = super::vk_error(r, "creating the Vulkan instance");
        if r == vk::Result::ERROR_INCOMPATIBLE_DRIVER {
            e = Error::new(ErrorKind::NoDevice, format!("no Vulkan 1.2 driver: {e}"));
        }
        e
    })
}

/// An owned Vulkan instance with its loader and, with validation, its debug messenger.
/// Dropping it destroys the messenger, then the instance (after every device made from it,
/// which the owners guarantee: a `Context` drops its device before its instance).
pub(crate) struct Instance {
    // Kept loaded for as long as the instance exists.
    pub(crate) entry: ash::Entry,
    pub(crate) raw: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    pub(crate) validation: bool,
}

impl Instance {
    /// Loads Vulkan and creates an instance; with `validation`, the Khronos layer (an
    /// error if it is not installed) and a messenger counting errors and warnings.
    pub(crate) fn new(validation: bool) -> Result<Instance> {
        let entry = load_entry()?;
        let _serial = lifecycle_lock();
        let raw = create_instance(&entry, validation)?;
        let mut instance = Instance {
            entry,
            raw,
            debug: None,
            validation,
        };
        if validation {
            let loader = ash::ext::debug_utils::Instance::new(&instance.entry, &instance.raw);
            // SAFETY: the instance was created with VK_EXT_debug_utils enabled.
            let messenger = unsafe { loader.create_debug_utils_messenger(&messenger_info(), None) }
                .map_err(vkr("creating the debug messenger"))?;
            instance.debug = Some((loader, messenger));
        }
        Ok(instance)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _serial = lifecycle_lock();
        // SAFETY: the owner dropped every device and object made from this instance first;
        // the messenger belongs to it and is destroyed before it, once.
        unsafe {
            if let Some((loader, m)) = self.debug.take() {
                loader.destroy_debug_utils_messenger(m, None);
            }
            self.raw.destroy_instance(None);
        }
    }
}
