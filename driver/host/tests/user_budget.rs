//! The budgets of all users' handles together (review of issue 30, A3): a user may open
//! any number of handles, so per-handle quotas alone let one user hold the engine's whole
//! CEP space (`CmConfig::max_ceps`) and as much nonpaged pool, and then kernel clients
//! (WinVerbs and ND through `iba_cm`) and administrators could connect no more. WinVerbs
//! and ndfltr give such a user an endpoint per call with no limit at all
//! (wv_ep.c `WvEpCreate`, nd_ep.cpp `NdEp::Create`); Linux's ucm/rdma_ucm likewise
//! (ucma.c `ucma_create_id`), so the limit is ours, not a counterpart's: its boundary is
//! what the budget says (policy.rs), the refusals those of the per-handle quotas.

use std::sync::Arc;

use ibcm_cep::CmConfig;
use ibcm_endpoint::{Caller, ClientEvent, ClientId, Device, FileId, Quotas, UserTotals};
use ibcm_host::records::{connect_in, format_rep_in};
use ibcm_host::verifier::Completion;
use ibcm_host::{Clock, Fabric, HostPlatform, Node, Wake, node_address, node_guid};
use ibcm_ioctl::{
    ABI_VERSION, ANY_ENDPOINT, CreateIn, CreateOut, EventRecord, HandleIn, ListenIn,
    QpTransitionsOut, VersionIn, code, event_type, status,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const SERVICE: u64 = 0x4321;
const EV: usize = EventRecord::SIZE as usize;
/// REJ reason "consumer defined" (IBA 12.6.7.2, Table 109): what a REQ refused for want
/// of room gets (the engine's `destroy` of a CEP in REQ_RCVD).
const CONSUMER_DEFINED: u16 = 28;

fn must(node: &Node, file: FileId, code: u32, input: &[u8], out: usize) -> Completion {
    let done = node.ioctl_now(file, code, input, out);
    assert_eq!(done.status, status::SUCCESS, "code {code:#x}");
    done
}

fn open(node: &Node, caller: Caller) -> FileId {
    let file = node.open_as(caller);
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    };
    must(node, file, code::VERSION, v.as_bytes(), 16);
    file
}

fn try_create(node: &Node, file: FileId) -> Result<u64, i32> {
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

fn create(node: &Node, file: FileId) -> u64 {
    try_create(node, file).expect("CREATE")
}

fn listen_in(handle: u64, service_id: u64, backlog: u32) -> ListenIn {
    let mut l = ListenIn::new_zeroed();
    l.size = ListenIn::SIZE;
    l.handle = handle;
    l.service_id = service_id;
    l.service_mask = u64::MAX;
    l.backlog = backlog;
    l
}

/// A listen of `file` on `service` with `backlog`: its handle.
fn listen(node: &Node, file: FileId, service: u64, backlog: u32) -> u64 {
    let l = create(node, file);
    let l_in = listen_in(l, service, backlog);
    must(node, file, code::LISTEN, l_in.as_bytes(), 0);
    l
}

fn handle_in(handle: u64) -> HandleIn {
    HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle,
    }
}

/// Every event queued on `file`'s channel now (taking REQs hands them to the user).
fn channel_events(node: &Node, file: FileId) -> Vec<EventRecord> {
    let key = node.ioctl(
        file,
        code::GET_EVENT,
        handle_in(ANY_ENDPOINT).as_bytes(),
        16 * EV,
    );
    match node.completion(key) {
        Some(done) => done.output[..done.information]
            .chunks(EV)
            .map(|c| EventRecord::read_from_bytes(c).unwrap())
            .collect(),
        None => {
            node.cancel(file, key);
            Vec::new()
        }
    }
}

/// A kernel client's callback that does nothing (none of its endpoints connects here).
fn ignore() -> ibcm_endpoint::Callback<HostPlatform> {
    Arc::new(|_: &Device<HostPlatform>, _: ClientId, _: &ClientEvent| 0)
}

/// Users' endpoints counted by the device, against those its files hold.
fn assert_counted(node: &Node, users: &[FileId]) {
    let held: usize = users.iter().map(|&f| node.device.endpoint_count(f)).sum();
    assert_eq!(node.device.user_totals().endpoints, held);
}

/// The review's test, on a host whose engine has 64 CEPs: eight users' handles of 8
/// endpoints each could hold them all, and then an administrator's CREATE and a kernel
/// client's `create_id` failed with NoResources. With a budget of 40 for all users, the
/// sixth handle's first CREATE fails as a handle over its own quota does
/// (STATUS_QUOTA_EXCEEDED) and the other 24 CEPs stay for administrators and kernel
/// clients. Seen failing on the code before: every user CREATE succeeded and the
/// administrator's 1st CREATE failed with STATUS_INSUFFICIENT_RESOURCES.
#[test]
fn users_together_keep_to_the_budget_and_leave_the_rest_to_kernel_clients_and_administrators() {
    let mut config = CmConfig::new(node_guid(0), [7; 32]);
    config.max_ceps = 64;
    let n = Node::new(
        config,
        node_address(0),
        Arc::new(Clock::virtual_at(1_000_000)),
        Arc::new(Wake::default()),
    );
    n.device.set_quotas(Quotas {
        endpoints: 8,
        all_users_endpoints: 40,
        ..Quotas::default()
    });
    let users: Vec<FileId> = (0..8).map(|_| open(&n, Caller::User)).collect();
    let mut held: Vec<Vec<u64>> = Vec::new();
    for &u in &users {
        let mut got = Vec::new();
        let refused = loop {
            match try_create(&n, u) {
                Ok(h) => got.push(h),
                Err(st) => break st,
            }
        };
        assert_eq!(refused, status::QUOTA_EXCEEDED);
        held.push(got);
    }
    let counts: Vec<usize> = held.iter().map(Vec::len).collect();
    assert_eq!(counts, [8, 8, 8, 8, 8, 0, 0, 0]);
    assert_eq!(n.device.user_totals().endpoints, 40);
    assert_counted(&n, &users);
    // The rest of the engine: an administrator's endpoints and a kernel client's.
    let admin = open(&n, Caller::Administrator);
    for _ in 0..12 {
        create(&n, admin);
    }
    for _ in 0..12 {
        n.device
            .create_id(ignore())
            .expect("a kernel client's create_id");
    }
    assert_eq!(n.device.user_totals().endpoints, 40, "neither is counted");
    // A user's endpoint going makes room for one more, and for no more.
    must(
        &n,
        users[0],
        code::DESTROY,
        handle_in(held[0][0]).as_bytes(),
        0,
    );
    assert_eq!(n.device.user_totals().endpoints, 39);
    let spare = users[5];
    create(&n, spare);
    assert_eq!(try_create(&n, spare), Err(status::QUOTA_EXCEEDED));
    for &u in &users {
        n.close(u);
    }
    n.close(admin);
    assert_eq!(n.device.user_totals(), UserTotals::default());
    assert!(n.violations().is_empty(), "{:?}", n.violations());
}
