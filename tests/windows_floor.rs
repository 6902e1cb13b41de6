//! The oldest Windows ibcm.sys loads on, decided once and kept in agreement: the manifest's
//! KMDF versions (root `Cargo.toml`), the INF's TargetOSVersion (`inf/ibcm.inx`) and the
//! README's list of supported Windows (between its `supported-windows` markers).
//!
//! The floor is the highest of:
//! - the WDF floor, `minimum-kmdf-version-minor`: the framework the binding needs. Every WDF
//!   function the binding calls (every `call_unsafe_wdf_function_binding!` in driver/kmdf)
//!   must be in [`WDF_CALLS`] and no newer than that minimum, and every WDF structure it
//!   sizes must be in [`WDF_STRUCTURES`] (unchanged since that minimum), or be guarded;
//!   "build on newer, run on older" itself starts at KMDF 1.25
//!   (<https://learn.microsoft.com/en-us/windows-hardware/drivers/wdf/building-a-wdf-driver-for-multiple-versions-of-windows>:
//!   "25 <= Minimum required <= Target version");
//! - the kernel routines the image imports: none newer than that
//!   ([`NEWER_KERNEL_ROUTINES`] are looked up at run time, never imported).

use std::collections::BTreeSet;

const MANIFEST: &str = include_str!("../Cargo.toml");
const INF: &str = include_str!("../inf/ibcm.inx");
const README: &str = include_str!("../README.md");

/// KMDF minor version -> the first Windows build that ships it, and its name. From
/// <https://learn.microsoft.com/en-us/windows-hardware/drivers/wdf/kmdf-version-history>
/// ("Included in"), builds from each release's own page.
const KMDF_HISTORY: [(u32, u32, &str); 5] = [
    (25, 17134, "Windows 10, version 1803"),
    (27, 17763, "Windows 10, version 1809 / Windows Server 2019"),
    (29, 18362, "Windows 10, version 1903"),
    (31, 19041, "Windows 10, version 2004"),
    (33, 20348, "Windows Server 2022 / Windows 11, version 21H2"),
];

/// Windows releases an administrator of a WinOF host may run (x64; WinOF's mlx4_bus installs
/// on all of them: `mlx4_bus_win8.inx` models `NTamd64.6.2`): name, build, KMDF in the box.
const RELEASES: [(&str, u32, u32); 9] = [
    ("Windows Server 2016", 14393, 19),
    ("Windows 10, version 1803", 17134, 25),
    ("Windows Server 2019", 17763, 27),
    ("Windows 10, version 1809", 17763, 27),
    ("Windows 10, version 1903", 18362, 29),
    ("Windows 10, version 2004", 19041, 31),
    ("Windows Server 2022", 20348, 33),
    ("Windows 11, version 21H2", 22000, 33),
    ("Windows Server 2025", 26100, 33),
];

/// Kernel routines newer than the WDF floor's Windows that the image must not import
/// statically (a missing import keeps the image from loading at all): (routine, first build,
/// source). `ExAllocatePool2` is looked up at DriverEntry instead (driver/kmdf/pool.rs).
const NEWER_KERNEL_ROUTINES: [(&str, u32, &str); 2] = [
    (
        "ExAllocatePool2",
        19041,
        "https://learn.microsoft.com/en-us/windows-hardware/drivers/kernel/updating-deprecated-exallocatepool-calls",
    ),
    (
        "ExAllocatePool3",
        19041,
        "https://learn.microsoft.com/en-us/windows-hardware/drivers/kernel/updating-deprecated-exallocatepool-calls",
    ),
];

/// Where a WDF function's minimum KMDF version comes from.
#[derive(Clone, Copy, Debug)]
enum Since {
    /// "Minimum KMDF version" 1.N on the function's page (the page was read).
    Doc(u32),
    /// In `src/publicinc/wdf/kmdf/1.15/wdffuncenum.h` of microsoft/Windows-Driver-Frameworks,
    /// the oldest public KMDF header set: available since 1.15 at the latest.
    Kmdf115,
}

impl Since {
    fn minor(self) -> u32 {
        match self {
            Since::Doc(m) => m,
            Since::Kmdf115 => 15,
        }
    }
}

/// Every WDF function the binding calls: name, the header (its page is
/// `https://learn.microsoft.com/en-us/windows-hardware/drivers/ddi/{header}/nf-{header}-{name lower-cased}`),
/// and since when it exists. The highest is WdfRequestMarkCancelableEx, KMDF 1.9 ("starting
/// with KMDF version 1.9", its page); the rest are 1.0 on their pages where read.
const WDF_CALLS: [(&str, &str, Since); 49] = [
    ("WdfControlDeviceInitAllocate", "wdfcontrol", Since::Kmdf115),
    ("WdfControlFinishInitializing", "wdfcontrol", Since::Kmdf115),
    ("WdfDeviceCreate", "wdfdevice", Since::Kmdf115),
    ("WdfDeviceInitAssignName", "wdfdevice", Since::Kmdf115),
    (
        "WdfDeviceInitAssignWdmIrpPreprocessCallback",
        "wdfdevice",
        Since::Kmdf115,
    ),
    ("WdfDeviceInitFree", "wdfdevice", Since::Kmdf115),
    (
        "WdfDeviceInitSetCharacteristics",
        "wdfdevice",
        Since::Kmdf115,
    ),
    ("WdfDeviceInitSetExclusive", "wdfdevice", Since::Kmdf115),
    (
        "WdfDeviceInitSetFileObjectConfig",
        "wdfdevice",
        Since::Kmdf115,
    ),
    (
        "WdfDeviceInitSetPnpPowerEventCallbacks",
        "wdfdevice",
        Since::Kmdf115,
    ),
    (
        "WdfDeviceInitSetRequestAttributes",
        "wdfdevice",
        Since::Doc(0),
    ),
    (
        "WdfDeviceWdmDispatchPreprocessedIrp",
        "wdfdevice",
        Since::Doc(0),
    ),
    ("WdfDpcCancel", "wdfdpc", Since::Kmdf115),
    ("WdfDpcCreate", "wdfdpc", Since::Kmdf115),
    ("WdfDpcEnqueue", "wdfdpc", Since::Kmdf115),
    ("WdfDpcGetParentObject", "wdfdpc", Since::Kmdf115),
    ("WdfDriverCreate", "wdfdriver", Since::Kmdf115),
    (
        "WdfDriverOpenParametersRegistryKey",
        "wdfdriver",
        Since::Kmdf115,
    ),
    ("WdfFdoInitSetFilter", "wdffdo", Since::Kmdf115),
    ("WdfFdoQueryForInterface", "wdffdo", Since::Kmdf115),
    ("WdfFileObjectGetDevice", "wdffileobject", Since::Doc(0)),
    ("WdfIoQueueCreate", "wdfio", Since::Kmdf115),
    ("WdfIoQueueGetDevice", "wdfio", Since::Kmdf115),
    ("WdfObjectDelete", "wdfobject", Since::Kmdf115),
    ("WdfObjectDereferenceActual", "wdfobject", Since::Kmdf115),
    (
        "WdfObjectGetTypedContextWorker",
        "wdfobject",
        Since::Kmdf115,
    ),
    ("WdfObjectReferenceActual", "wdfobject", Since::Kmdf115),
    ("WdfRegistryClose", "wdfregistry", Since::Kmdf115),
    ("WdfRegistryQueryULong", "wdfregistry", Since::Kmdf115),
    (
        "WdfRequestCompleteWithInformation",
        "wdfrequest",
        Since::Kmdf115,
    ),
    ("WdfRequestGetFileObject", "wdfrequest", Since::Kmdf115),
    ("WdfRequestGetIoQueue", "wdfrequest", Since::Kmdf115),
    ("WdfRequestGetRequestorMode", "wdfrequest", Since::Kmdf115),
    ("WdfRequestMarkCancelableEx", "wdfrequest", Since::Doc(9)),
    (
        "WdfRequestRetrieveInputBuffer",
        "wdfrequest",
        Since::Kmdf115,
    ),
    (
        "WdfRequestRetrieveOutputBuffer",
        "wdfrequest",
        Since::Kmdf115,
    ),
    ("WdfRequestUnmarkCancelable", "wdfrequest", Since::Kmdf115),
    ("WdfRequestWdmGetIrp", "wdfrequest", Since::Kmdf115),
    ("WdfTimerCreate", "wdftimer", Since::Kmdf115),
    ("WdfTimerGetParentObject", "wdftimer", Since::Kmdf115),
    ("WdfTimerStart", "wdftimer", Since::Kmdf115),
    ("WdfTimerStop", "wdftimer", Since::Kmdf115),
    ("WdfWaitLockAcquire", "wdfsync", Since::Kmdf115),
    ("WdfWaitLockCreate", "wdfsync", Since::Kmdf115),
    ("WdfWaitLockRelease", "wdfsync", Since::Kmdf115),
    ("WdfWorkItemCreate", "wdfworkitem", Since::Kmdf115),
    ("WdfWorkItemEnqueue", "wdfworkitem", Since::Kmdf115),
    ("WdfWorkItemFlush", "wdfworkitem", Since::Kmdf115),
    ("WdfWorkItemGetParentObject", "wdfworkitem", Since::Kmdf115),
];

/// WDF structures the binding passes with `Size = sizeof` (the 1.33 layout): each is the same
/// in the KMDF 1.25 and 1.33 headers of microsoft/Windows-Driver-Frameworks
/// (src/publicinc/wdf/kmdf/{1.25 or the newest older set,1.33}), so an older framework
/// accepts the size; a structure that grew after the minimum would need `WDF_STRUCTURE_SIZE`.
const WDF_STRUCTURES: [&str; 8] = [
    "WDF_DRIVER_CONFIG",
    "WDF_PNPPOWER_EVENT_CALLBACKS",
    "WDF_OBJECT_ATTRIBUTES",
    "WDF_FILEOBJECT_CONFIG",
    "WDF_TIMER_CONFIG",
    "WDF_DPC_CONFIG",
    "WDF_WORKITEM_CONFIG",
    "WDF_IO_QUEUE_CONFIG",
];

/// `key = N` in the manifest's `[package.metadata.wdk.driver-model]`.
fn driver_model(key: &str) -> u32 {
    let section = MANIFEST
        .split("[package.metadata.wdk.driver-model]")
        .nth(1)
        .expect("a [package.metadata.wdk.driver-model] section");
    let section = section.split("\n[").next().unwrap();
    section
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .unwrap_or_else(|| panic!("no {key} in the driver model"))
        .1
        .trim()
        .parse()
        .unwrap()
}

/// The build of the INF's models decoration `NT$ARCH$.10.0...BUILD`.
fn inf_build() -> u32 {
    let line = INF
        .lines()
        .map(|l| l.split(';').next().unwrap().trim())
        .find(|l| l.starts_with("%ManufacturerName%"))
        .expect("the [Manufacturer] line");
    let decoration = line.rsplit(',').next().unwrap().trim();
    let build = decoration
        .strip_prefix("NT$ARCH$.10.0...")
        .unwrap_or_else(|| panic!("decoration {decoration}: not NT$ARCH$.10.0...BUILD"));
    build.parse().unwrap()
}

/// Rows of the README's supported-Windows table: (name, build, KMDF minor).
fn readme_rows() -> Vec<(String, u32, u32)> {
    let block = README
        .split("<!-- supported-windows: begin")
        .nth(1)
        .and_then(|b| b.split("<!-- supported-windows: end -->").next())
        .expect("the README's supported-windows block");
    block
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| Windows |"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 3, "row {l}");
            let kmdf = cells[2]
                .strip_prefix("1.")
                .expect("KMDF 1.N")
                .parse()
                .unwrap();
            (cells[0].to_string(), cells[1].parse().unwrap(), kmdf)
        })
        .collect()
}

/// The WDF functions driver/kmdf calls.
fn wdf_calls_made() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/driver/kmdf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for call in text.split("call_unsafe_wdf_function_binding!(").skip(1) {
            let name: String = call
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

/// The WDF structures driver/kmdf sizes with `size_of_ulong::<T>()`.
fn wdf_structures_sized() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/driver/kmdf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for sized in text.split("size_of_ulong::<").skip(1) {
            let name: String = sized
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with("WDF_") {
                out.insert(name);
            }
        }
    }
    out
}

/// The oldest build the image loads on: the WDF floor's build (no kernel import is newer,
/// [`the_image_imports_no_kernel_routine_newer_than_the_floor`]).
fn floor_build() -> u32 {
    let minimum = driver_model("minimum-kmdf-version-minor");
    KMDF_HISTORY
        .iter()
        .find(|(m, _, _)| *m == minimum)
        .unwrap_or_else(|| panic!("KMDF 1.{minimum} is not in the history"))
        .1
}

#[test]
fn the_image_imports_no_kernel_routine_newer_than_the_floor() {
    let floor = floor_build();
    // wdk-alloc's allocator imports ExAllocatePool2 (Windows 10 2004).
    assert!(
        !MANIFEST.contains("wdk-alloc"),
        "wdk-alloc imports ExAllocatePool2: the image would not load below build 19041"
    );
    for (routine, build, source) in NEWER_KERNEL_ROUTINES {
        assert!(build > floor, "{routine} is not newer than the floor");
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/driver/kmdf")).unwrap()
        {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                let imported = line.contains(&format!("ntddk::{routine}"))
                    || (line.contains("ntddk::{") && line.contains(&format!("{routine},")))
                    || line.contains(&format!("fn {routine}("));
                assert!(
                    !imported,
                    "{}: imports {routine} (build {build}, {source}): look it up with \
                     MmGetSystemRoutineAddress instead",
                    path.display()
                );
            }
        }
    }
    let pool = include_str!("../driver/kmdf/pool.rs");
    assert!(
        pool.contains("wdf::utf16(\"ExAllocatePool2\")"),
        "looked up by name"
    );
}

#[test]
fn the_manifest_builds_on_133_and_runs_from_the_lowest_kmdf_the_calls_allow() {
    assert_eq!(driver_model("kmdf-version-major"), 1);
    // The headers the genuine check has (../shared/tools/wdk-genuine) and CI's WDK ship.
    assert_eq!(driver_model("target-kmdf-version-minor"), 33);
    let minimum = driver_model("minimum-kmdf-version-minor");
    // "Build on newer, run on older" exists from 1.25 on.
    assert!((25..=33).contains(&minimum), "minimum 1.{minimum}");
    let needed = WDF_CALLS.iter().map(|c| c.2.minor()).max().unwrap().max(25);
    assert_eq!(
        minimum, needed,
        "minimum-kmdf-version-minor is not the lowest the calls allow"
    );
}

#[test]
fn every_wdf_call_the_binding_makes_is_in_the_table_and_no_newer_than_the_minimum() {
    let minimum = driver_model("minimum-kmdf-version-minor");
    let made = wdf_calls_made();
    assert!(made.len() > 40, "found only {made:?}");
    let listed: BTreeSet<String> = WDF_CALLS.iter().map(|c| c.0.to_string()).collect();
    let unlisted: Vec<&String> = made.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "WDF calls with no minimum KMDF version on record (add them to WDF_CALLS, from their \
         page's \"Minimum KMDF version\", or guard them with WdfFunctionCount): {unlisted:?}"
    );
    let stale: Vec<&String> = listed.difference(&made).collect();
    assert!(
        stale.is_empty(),
        "WDF_CALLS lists calls the binding no longer makes: {stale:?}"
    );
    for (name, header, since) in WDF_CALLS {
        assert!(
            since.minor() <= minimum,
            "{name} ({header}.h) needs KMDF 1.{}, above the minimum 1.{minimum}",
            since.minor()
        );
    }
    let top = WDF_CALLS
        .iter()
        .filter(|c| matches!(c.2, Since::Doc(_)))
        .max_by_key(|c| c.2.minor())
        .unwrap();
    assert_eq!(top.0, "WdfRequestMarkCancelableEx");
}

#[test]
fn every_wdf_structure_the_binding_sizes_is_unchanged_since_the_minimum() {
    let sized = wdf_structures_sized();
    assert!(sized.len() >= 7, "found only {sized:?}");
    for s in &sized {
        assert!(
            WDF_STRUCTURES.contains(&s.as_str()),
            "{s} is passed with the 1.33 size: check its layout in the KMDF 1.25 headers \
             (WDF_STRUCTURE_SIZE if it grew) and add it to WDF_STRUCTURES"
        );
    }
}

#[test]
fn the_inf_admits_exactly_the_floor() {
    assert_eq!(
        inf_build(),
        floor_build(),
        "the INF's TargetOSVersion build is not the floor (KMDF minimum and kernel imports)"
    );
}

#[test]
fn the_readme_lists_every_supported_release_and_none_below_the_floor() {
    let floor = floor_build();
    let rows = readme_rows();
    let minimum = driver_model("minimum-kmdf-version-minor");
    for (name, build, kmdf) in &rows {
        let known = RELEASES
            .iter()
            .find(|r| name.starts_with(r.0))
            .unwrap_or_else(|| panic!("README row {name}: not a known release"));
        assert_eq!((*build, *kmdf), (known.1, known.2), "README row {name}");
        assert!(
            *build >= floor,
            "README lists {name} (build {build}) below the floor {floor}"
        );
        assert!(*kmdf >= minimum, "README lists {name} with KMDF 1.{kmdf}");
    }
    for (name, build, _) in RELEASES {
        let listed = rows.iter().any(|r| r.0.starts_with(name));
        // Windows 10 releases after the floor are covered by "version N and later".
        let covered = name.starts_with("Windows 10") && build >= floor;
        assert_eq!(
            listed || covered,
            build >= floor,
            "{name} (build {build}): the README's list and the floor {floor} disagree"
        );
    }
    assert_eq!(rows.iter().map(|r| r.1).min(), Some(floor));
}
