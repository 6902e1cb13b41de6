//! `ibcm install` / `ibcm uninstall` on Windows: the HCA devnodes' `UpperFilters` through
//! SetupAPI, and the device restart that makes PnP rebuild the stack, as devcon does
//! (`SetupDiSetClassInstallParams(DIF_PROPERTYCHANGE, DICS_PROPCHANGE)` +
//! `SetupDiCallClassInstaller`). Which list to write is `upper_filters` (portable, tested);
//! this file only reads and writes the devnodes.
//!
//! An HCA is a present devnode whose `UpperFilters` names `ibbus` (WinOF's base INF writes
//! it on every HCA it installs: `mlx4_bus.inx:278-279`, `mlx4_bus_win8.inx:91`).
#![allow(unsafe_code)]

use std::io;

use windows_sys::Win32::Devices::DeviceAndDriverInstallation::{
    DI_NEEDREBOOT, DI_NEEDRESTART, DICS_FLAG_CONFIGSPECIFIC, DICS_PROPCHANGE, DIF_PROPERTYCHANGE,
    DIGCF_ALLCLASSES, DIGCF_PRESENT, HDEVINFO, SP_CLASSINSTALL_HEADER, SP_DEVINFO_DATA,
    SP_DEVINSTALL_PARAMS_W, SP_PROPCHANGE_PARAMS, SPDRP_DEVICEDESC, SPDRP_HARDWAREID,
    SPDRP_UPPERFILTERS, SetupDiCallClassInstaller, SetupDiDestroyDeviceInfoList,
    SetupDiEnumDeviceInfo, SetupDiGetClassDevsW, SetupDiGetDeviceInstallParamsW,
    SetupDiGetDeviceInstanceIdW, SetupDiGetDevicePropertyW, SetupDiGetDeviceRegistryPropertyW,
    SetupDiSetClassInstallParamsW, SetupDiSetDeviceRegistryPropertyW,
};
use windows_sys::Win32::Devices::Properties::{DEVPKEY_Device_Stack, DEVPROPTYPE};
use windows_sys::Win32::Foundation::{
    ERROR_FILE_NOT_FOUND, ERROR_NO_MORE_ITEMS, ERROR_SUCCESS, INVALID_HANDLE_VALUE,
};
use windows_sys::Win32::System::Registry::{
    HKEY_LOCAL_MACHINE, REG_DWORD, RRF_RT_REG_DWORD, RegGetValueW, RegSetKeyValueW,
};
use windows_sys::Win32::System::Services::{
    CloseServiceHandle, OpenSCManagerW, OpenServiceW, SC_MANAGER_CONNECT, SERVICE_QUERY_STATUS,
};

use crate::admin::{PARAMETERS_KEY, SWITCH_VALUE};
use crate::host_report::{self, Devnode};
use crate::upper_filters::{self, IBBUS};

/// One HCA devnode.
#[derive(Debug, Clone)]
pub struct Hca {
    /// The device instance ID (`PCI\VEN_15B3&DEV_1003&...`).
    pub instance_id: String,
    /// The device description.
    pub description: String,
    /// Its `UpperFilters`, lowest first.
    pub upper_filters: Vec<String>,
}

/// What a restart did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The stack was rebuilt with the new list.
    Done,
    /// The device could not be stopped now (in use): the new list applies at the next boot.
    RebootNeeded,
}

/// Whether the service `name` is installed (a filter whose service is missing keeps the
/// HCA from starting).
pub fn service_installed(name: &str) -> bool {
    let name = wide(name);
    // SAFETY: (W1) local machine, active database; no pointers but the null ones.
    let scm = unsafe { OpenSCManagerW(std::ptr::null(), std::ptr::null(), SC_MANAGER_CONNECT) };
    if scm.is_null() {
        return false;
    }
    // SAFETY: (W2) `scm` is open; `name` is NUL-terminated and outlives the call.
    let service = unsafe { OpenServiceW(scm, name.as_ptr(), SERVICE_QUERY_STATUS) };
    let installed = !service.is_null();
    if installed {
        // SAFETY: (W3) opened above, closed once.
        unsafe { CloseServiceHandle(service) };
    }
    // SAFETY: (W4) opened above, closed once.
    unsafe { CloseServiceHandle(scm) };
    installed
}

/// Every present HCA devnode.
pub fn hcas() -> io::Result<Vec<Hca>> {
    let set = DeviceSet::present()?;
    let mut out = Vec::new();
    for data in set.devices() {
        let data = data?;
        let Some(units) = set.property(&data, SPDRP_UPPERFILTERS)? else {
            continue;
        };
        let list = upper_filters::decode_multi_sz(&units);
        if !list.iter().any(|e| e.eq_ignore_ascii_case(IBBUS)) {
            continue;
        }
        let description = set
            .property(&data, SPDRP_DEVICEDESC)?
            .map(|u| upper_filters::decode_multi_sz(&u).join(" "))
            .unwrap_or_default();
        out.push(Hca {
            instance_id: set.instance_id(&data)?,
            description,
            upper_filters: list,
        });
    }
    Ok(out)
}

/// Every present HCA devnode for `ibcm status`, read-only: a supported hardware ID
/// ([`host_report::supported_hca`]) or ibbus in its `UpperFilters`, with or without ibcm.
pub fn devnodes() -> io::Result<Vec<Devnode>> {
    let set = DeviceSet::present()?;
    let mut out = Vec::new();
    for data in set.devices() {
        let data = data?;
        let multi = |property| -> io::Result<Vec<String>> {
            Ok(set
                .property(&data, property)?
                .map(|u| upper_filters::decode_multi_sz(&u))
                .unwrap_or_default())
        };
        let hardware_ids = multi(SPDRP_HARDWAREID)?;
        let filters = multi(SPDRP_UPPERFILTERS)?;
        let has_ibbus = filters.iter().any(|e| e.eq_ignore_ascii_case(IBBUS));
        if !has_ibbus && !host_report::supported_hca(&hardware_ids) {
            continue;
        }
        out.push(Devnode {
            instance_id: set.instance_id(&data)?,
            description: multi(SPDRP_DEVICEDESC)?.join(" "),
            hardware_ids,
            upper_filters: filters,
            stack: set.stack(&data),
        });
    }
    Ok(out)
}

/// Writes `list` as the `UpperFilters` of the devnode `instance_id`; PnP reads it when
/// it next builds the device's stack.
pub fn write(instance_id: &str, list: &[String]) -> io::Result<()> {
    with_device(instance_id, |set, data| set.set_upper_filters(data, list))
}

/// [`write`], then restart the device so that the stack is rebuilt now.
pub fn write_and_restart(instance_id: &str, list: &[String]) -> io::Result<Restart> {
    with_device(instance_id, |set, data| {
        set.set_upper_filters(data, list)?;
        set.restart(data)
    })
}

/// Restarts the devnode `instance_id` (its stack is rebuilt; its drivers' start routines
/// run again).
pub fn restart(instance_id: &str) -> io::Result<Restart> {
    with_device(instance_id, |set, data| set.restart(data))
}

/// The kill switch's value (`None`: absent, or no Parameters key).
pub fn switch_value() -> io::Result<Option<u32>> {
    let key = wide(PARAMETERS_KEY);
    let value = wide(SWITCH_VALUE);
    let mut data = 0u32;
    let mut size = size_of::<u32>() as u32;
    // SAFETY: (W15) HKLM is a predefined key; the names are NUL-terminated and outlive the
    // call; `data` holds `size` bytes.
    let e = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            RRF_RT_REG_DWORD,
            std::ptr::null_mut(),
            (&raw mut data).cast(),
            &mut size,
        )
    };
    match e {
        ERROR_SUCCESS => Ok(Some(data)),
        ERROR_FILE_NOT_FOUND => Ok(None),
        e => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

/// Sets the kill switch's value (1: off, 0: on); the key is made if missing.
pub fn set_switch(off: bool) -> io::Result<()> {
    let key = wide(PARAMETERS_KEY);
    let value = wide(SWITCH_VALUE);
    let data = u32::from(off);
    // SAFETY: (W16) as W15; `data` is the REG_DWORD's 4 bytes.
    let e = unsafe {
        RegSetKeyValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            REG_DWORD,
            (&raw const data).cast(),
            size_of::<u32>() as u32,
        )
    };
    if e == ERROR_SUCCESS {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(e as i32))
    }
}

fn with_device<R>(
    instance_id: &str,
    f: impl FnOnce(&DeviceSet, &mut SP_DEVINFO_DATA) -> io::Result<R>,
) -> io::Result<R> {
    let set = DeviceSet::present()?;
    for data in set.devices() {
        let mut data = data?;
        if set.instance_id(&data)?.eq_ignore_ascii_case(instance_id) {
            return f(&set, &mut data);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{instance_id}: no such device present"),
    ))
}

fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(Some(0)).collect()
}

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A SetupAPI device information set, destroyed on drop.
struct DeviceSet(HDEVINFO);

impl DeviceSet {
    /// Every present device of every class.
    fn present() -> io::Result<Self> {
        // SAFETY: (W5) no class GUID, enumerator or window: every present device.
        let set = unsafe {
            SetupDiGetClassDevsW(
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null_mut(),
                DIGCF_ALLCLASSES | DIGCF_PRESENT,
            )
        };
        if set == INVALID_HANDLE_VALUE as HDEVINFO {
            return Err(last_error("SetupDiGetClassDevs"));
        }
        Ok(Self(set))
    }

    fn devices(&self) -> impl Iterator<Item = io::Result<SP_DEVINFO_DATA>> + '_ {
        let mut index = 0u32;
        std::iter::from_fn(move || {
            let mut data = SP_DEVINFO_DATA {
                cbSize: size_of::<SP_DEVINFO_DATA>() as u32,
                ..Default::default()
            };
            // SAFETY: (W6) the set is live; `data` is sized as SetupAPI requires.
            let ok = unsafe { SetupDiEnumDeviceInfo(self.0, index, &mut data) };
            index += 1;
            if ok != 0 {
                return Some(Ok(data));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(ERROR_NO_MORE_ITEMS as i32) {
                None
            } else {
                Some(Err(e))
            }
        })
    }

    /// A string or multi-string property as UTF-16 units; None when the device has none.
    fn property(&self, data: &SP_DEVINFO_DATA, property: u32) -> io::Result<Option<Vec<u16>>> {
        let mut needed = 0u32;
        // SAFETY: (W7) the set and `data` are live; a size query (null buffer, size 0).
        let ok = unsafe {
            SetupDiGetDeviceRegistryPropertyW(
                self.0,
                data,
                property,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                &mut needed,
            )
        };
        if ok == 0 && needed == 0 {
            // ERROR_INVALID_DATA: the device has no such property.
            return Ok(None);
        }
        let mut units = vec![0u16; (needed as usize).div_ceil(2)];
        // SAFETY: (W8) as W7, into a buffer of `needed` bytes (rounded up to whole units).
        let ok = unsafe {
            SetupDiGetDeviceRegistryPropertyW(
                self.0,
                data,
                property,
                std::ptr::null_mut(),
                units.as_mut_ptr().cast(),
                (units.len() * 2) as u32,
                &mut needed,
            )
        };
        if ok == 0 {
            return Err(last_error("SetupDiGetDeviceRegistryProperty"));
        }
        units.truncate((needed as usize) / 2);
        Ok(Some(units))
    }

    /// The device's driver stack (`DEVPKEY_Device_Stack`, a string list, top down); None
    /// when it cannot be read (a device that is not started has none).
    fn stack(&self, data: &SP_DEVINFO_DATA) -> Option<Vec<String>> {
        let mut kind: DEVPROPTYPE = 0;
        let mut needed = 0u32;
        // SAFETY: (W17) the set and `data` are live; a size query (null buffer, size 0).
        unsafe {
            SetupDiGetDevicePropertyW(
                self.0,
                data,
                &DEVPKEY_Device_Stack,
                &mut kind,
                std::ptr::null_mut(),
                0,
                &mut needed,
                0,
            )
        };
        if needed == 0 {
            return None;
        }
        let mut units = vec![0u16; (needed as usize).div_ceil(2)];
        // SAFETY: (W18) as W17, into a buffer of at least `needed` bytes.
        let ok = unsafe {
            SetupDiGetDevicePropertyW(
                self.0,
                data,
                &DEVPKEY_Device_Stack,
                &mut kind,
                units.as_mut_ptr().cast(),
                (units.len() * 2) as u32,
                &mut needed,
                0,
            )
        };
        (ok != 0).then(|| upper_filters::decode_multi_sz(&units))
    }

    fn instance_id(&self, data: &SP_DEVINFO_DATA) -> io::Result<String> {
        // MAX_DEVICE_ID_LEN (200) and its NUL.
        let mut buffer = [0u16; 201];
        let mut needed = 0u32;
        // SAFETY: (W9) the set and `data` are live; the buffer's length in characters.
        let ok = unsafe {
            SetupDiGetDeviceInstanceIdW(
                self.0,
                data,
                buffer.as_mut_ptr(),
                buffer.len() as u32,
                &mut needed,
            )
        };
        if ok == 0 {
            return Err(last_error("SetupDiGetDeviceInstanceId"));
        }
        let end = buffer.iter().position(|&u| u == 0).unwrap_or(buffer.len());
        Ok(String::from_utf16_lossy(&buffer[..end]))
    }

    fn set_upper_filters(&self, data: &mut SP_DEVINFO_DATA, list: &[String]) -> io::Result<()> {
        let units = upper_filters::encode_multi_sz(list);
        // An empty list deletes the value (a null buffer of size 0).
        let (buffer, bytes) = if list.is_empty() {
            (std::ptr::null(), 0)
        } else {
            (units.as_ptr().cast::<u8>(), (units.len() * 2) as u32)
        };
        // SAFETY: (W10) the set and `data` are live; `buffer` holds `bytes` bytes of
        // REG_MULTI_SZ (or is null with 0) and outlives the call.
        let ok = unsafe {
            SetupDiSetDeviceRegistryPropertyW(self.0, data, SPDRP_UPPERFILTERS, buffer, bytes)
        };
        if ok == 0 {
            return Err(last_error("SetupDiSetDeviceRegistryProperty(UpperFilters)"));
        }
        Ok(())
    }

    /// devcon's restart: a property change for the device's current hardware profile.
    fn restart(&self, data: &SP_DEVINFO_DATA) -> io::Result<Restart> {
        let params = SP_PROPCHANGE_PARAMS {
            ClassInstallHeader: SP_CLASSINSTALL_HEADER {
                cbSize: size_of::<SP_CLASSINSTALL_HEADER>() as u32,
                InstallFunction: DIF_PROPERTYCHANGE,
            },
            StateChange: DICS_PROPCHANGE,
            Scope: DICS_FLAG_CONFIGSPECIFIC,
            HwProfile: 0,
        };
        // SAFETY: (W11) the set and `data` are live; the parameters begin with their
        // class-install header, and the size is the whole structure's.
        let ok = unsafe {
            SetupDiSetClassInstallParamsW(
                self.0,
                data,
                &params.ClassInstallHeader,
                size_of::<SP_PROPCHANGE_PARAMS>() as u32,
            )
        };
        if ok == 0 {
            return Err(last_error("SetupDiSetClassInstallParams"));
        }
        // SAFETY: (W12) as W11; the class-install parameters were set just above.
        let ok = unsafe { SetupDiCallClassInstaller(DIF_PROPERTYCHANGE, self.0, data) };
        if ok == 0 {
            return Err(last_error("SetupDiCallClassInstaller(DIF_PROPERTYCHANGE)"));
        }
        let mut install = SP_DEVINSTALL_PARAMS_W {
            cbSize: size_of::<SP_DEVINSTALL_PARAMS_W>() as u32,
            ..Default::default()
        };
        // SAFETY: (W13) as W11; `install` is sized as SetupAPI requires.
        let ok = unsafe { SetupDiGetDeviceInstallParamsW(self.0, data, &mut install) };
        if ok != 0 && install.Flags & (DI_NEEDREBOOT | DI_NEEDRESTART) != 0 {
            return Ok(Restart::RebootNeeded);
        }
        Ok(Restart::Done)
    }
}

impl Drop for DeviceSet {
    fn drop(&mut self) {
        // SAFETY: (W14) created by SetupDiGetClassDevs, destroyed once.
        unsafe { SetupDiDestroyDeviceInfoList(self.0) };
    }
}
