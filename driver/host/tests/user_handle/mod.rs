//! A user-mode caller's handle on a simulated node, IOCTL by IOCTL, for the tests of what
//! one handle may do (security.rs, user_budget.rs): open it as a caller, check the ABI
//! version, create endpoints and read its event channel.

use ibcm_endpoint::{Caller, FileId};
use ibcm_host::Node;
use ibcm_host::records::handle_in;
use ibcm_host::verifier::Completion;
use ibcm_ioctl::{
    ABI_VERSION, ANY_ENDPOINT, CreateIn, CreateOut, EventRecord, VersionIn, code, status,
};
use zerocopy::{FromBytes, IntoBytes};

/// The size of one event record.
pub const EV: usize = EventRecord::SIZE as usize;

/// An IOCTL that must succeed: its completion.
pub fn must(node: &Node, file: FileId, code: u32, input: &[u8], out: usize) -> Completion {
    let done = node.ioctl_now(file, code, input, out);
    assert_eq!(done.status, status::SUCCESS, "code {code:#x}");
    done
}

/// A handle opened as `caller`, its ABI version checked.
pub fn open(node: &Node, caller: Caller) -> FileId {
    let file = node.open_as(caller);
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    };
    must(node, file, code::VERSION, v.as_bytes(), 16);
    file
}

/// CREATE: the new endpoint's handle, or the status it failed with.
pub fn try_create(node: &Node, file: FileId) -> Result<u64, i32> {
    let c = CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    };
    let done = node.ioctl_now(file, code::CREATE, c.as_bytes(), 16);
    if done.status != status::SUCCESS {
        return Err(done.status);
    }
    Ok(CreateOut::read_from_bytes(&done.output).unwrap().handle)
}

/// CREATE, which must succeed.
pub fn create(node: &Node, file: FileId) -> u64 {
    try_create(node, file).expect("CREATE")
}

/// The event records a completed GET_EVENT brought.
pub fn events(done: &Completion) -> Vec<EventRecord> {
    done.output[..done.information]
        .chunks(EV)
        .map(|c| EventRecord::read_from_bytes(c).unwrap())
        .collect()
}

/// Every event queued on `file`'s channel now (taking REQs hands them to the user).
pub fn channel_events(node: &Node, file: FileId) -> Vec<EventRecord> {
    let key = node.ioctl(
        file,
        code::GET_EVENT,
        handle_in(ANY_ENDPOINT).as_bytes(),
        16 * EV,
    );
    match node.completion(key) {
        Some(done) => events(&done),
        None => {
            node.cancel(file, key);
            Vec::new()
        }
    }
}
