//! What a hostile local user can do to others on the same host (docs/security.md, "A
//! local user"): two handles opened as `Caller::User` are two users' processes; an
//! administrator's handle stands for administrators and kernel clients.

mod user_handle;

use ibcm_endpoint::{Caller, USER_MAX_PACKET_LIFE_TIME};
use ibcm_host::Fabric;
use ibcm_host::records::{connect_in, path};
use ibcm_ioctl::{LapIn, MAX_CHANNEL_GET_EVENTS, code, status};
use user_handle::{create, must, open};
use zerocopy::{FromZeros, IntoBytes};

const SERVICE: u64 = 0x7e57;

/// Timewait is 2 x packet life time + ACK delay (IBA 12.9.8.7): with 31, a user's closed
/// handle left its CEP and QPN binding behind for 4.9 hours. A user's path carries at
/// most [`USER_MAX_PACKET_LIFE_TIME`] (20: at or above Linux's
/// `CMA_IBOE_PACKET_LIFETIME` = 18); an administrator's any. Seen failing on the old
/// code: the user's CONNECT with packet life time 31 completed with STATUS_SUCCESS.
#[test]
fn a_users_packet_life_time_is_bounded_and_an_administrators_is_not() {
    const { assert!(USER_MAX_PACKET_LIFE_TIME >= 18) };
    let fabric = Fabric::new(2, 21);
    let n0 = &fabric.nodes[0];
    let (user, admin) = (open(n0, Caller::User), open(n0, Caller::Administrator));

    let u = create(n0, user);
    let mut c = connect_in(u, SERVICE, 0x501);
    c.primary.packet_life_time = 31;
    let done = n0.ioctl_now(user, code::CONNECT, c.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    c.primary.packet_life_time = USER_MAX_PACKET_LIFE_TIME + 1;
    let done = n0.ioctl_now(user, code::CONNECT, c.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    // The alternate path likewise.
    c.primary.packet_life_time = 18;
    c.flags |= ibcm_ioctl::flags::ALTERNATE_PATH;
    c.alternate = path(0, 1);
    c.alternate.packet_life_time = 31;
    let done = n0.ioctl_now(user, code::CONNECT, c.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    c.alternate.packet_life_time = USER_MAX_PACKET_LIFE_TIME;
    c.primary.packet_life_time = USER_MAX_PACKET_LIFE_TIME;
    must(n0, user, code::CONNECT, c.as_bytes(), 0);

    // A LAP's alternate path too (checked before the state).
    let mut lap = LapIn::new_zeroed();
    lap.size = LapIn::SIZE;
    lap.handle = u;
    lap.alternate = path(0, 1);
    lap.alternate.packet_life_time = 31;
    let done = n0.ioctl_now(user, code::LAP, lap.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);

    let a = create(n0, admin);
    let mut c = connect_in(a, SERVICE, 0x502);
    c.primary.packet_life_time = 31;
    must(n0, admin, code::CONNECT, c.as_bytes(), 0);
}

/// Each account has its own share of the all-users budgets: one account's handles, however
/// many, cannot take every user's endpoints. Here (small budgets, for speed) a handle may
/// hold 4, all users 16, an account 8: account 1's four handles get 8 and no more, and
/// account 2's first CREATE still succeeds; an administrator is not counted. Seen failing
/// with the per-account check removed (a mutant of `UserTotals::of` answering None, as the
/// old code had no accounts): account 1 took all 16 and account 2's CREATE failed with
/// STATUS_QUOTA_EXCEEDED.
#[test]
fn one_account_cannot_take_every_users_budget() {
    let fabric = Fabric::new(1, 22);
    let n = &fabric.nodes[0];
    n.device.set_quotas(ibcm_endpoint::Quotas {
        endpoints: 4,
        all_users_endpoints: 16,
        account_endpoints: 8,
        ..ibcm_endpoint::Quotas::default()
    });
    let hog: Vec<_> = (0..4).map(|_| open(n, Caller::UserOf(1))).collect();
    let mut got = 0;
    for &h in &hog {
        for _ in 0..4 {
            match user_handle::try_create(n, h) {
                Ok(_) => got += 1,
                Err(st) => assert_eq!(st, status::QUOTA_EXCEEDED),
            }
        }
    }
    assert_eq!(got, 8);
    assert_eq!(n.device.user_totals().account(1).endpoints, 8);
    let other = open(n, Caller::UserOf(2));
    create(n, other);
    let admin = open(n, Caller::Administrator);
    for _ in 0..20 {
        create(n, admin);
    }
    assert_eq!(n.device.user_totals().endpoints, 9);
    // Closing the account's handles gives its share back.
    for h in hog {
        n.close(h);
    }
    assert_eq!(n.device.user_totals().account(1).endpoints, 0);
    let again = open(n, Caller::UserOf(1));
    create(n, again);
    assert!(n.violations().is_empty(), "{:?}", n.violations());
}

/// Pending GET_EVENTs are bounded: one per endpoint (as `code::GET_EVENT` says), and
/// [`MAX_CHANNEL_GET_EVENTS`] on a handle's channel; each holds an IRP and its system
/// buffer on Windows. The handle still closes with every pending one cancelled. Seen
/// failing on the old code: the second GET_EVENT on the endpoint pended (no completion),
/// as did all 100 000 on the channel.
#[test]
fn pending_get_events_are_bounded_per_endpoint_and_per_channel() {
    let fabric = Fabric::new(1, 23);
    let n = &fabric.nodes[0];
    let user = open(n, Caller::User);
    let e = create(n, user);
    let get = |handle: u64| {
        n.ioctl(
            user,
            code::GET_EVENT,
            ibcm_host::records::handle_in(handle).as_bytes(),
            user_handle::EV,
        )
    };
    let first = get(e);
    assert!(n.completion(first).is_none(), "the first one pends");
    let second = get(e);
    let done = n.completion(second).expect("a second is refused at once");
    assert_eq!(done.status, status::INVALID_DEVICE_STATE);

    let keys: Vec<u64> = (0..MAX_CHANNEL_GET_EVENTS)
        .map(|_| get(ibcm_ioctl::ANY_ENDPOINT))
        .collect();
    assert!(keys.iter().all(|&k| n.completion(k).is_none()));
    let over = get(ibcm_ioctl::ANY_ENDPOINT);
    let done = n.completion(over).expect("past the cap, refused at once");
    assert_eq!(done.status, status::QUOTA_EXCEEDED);
    // Another handle has its own.
    let other = open(n, Caller::User);
    assert!(user_handle::channel_events(n, other).is_empty());

    n.close(user);
    for k in keys.into_iter().chain([first]) {
        assert_eq!(n.completion(k).map(|d| d.status), Some(status::CANCELLED));
    }
    assert!(n.violations().is_empty(), "{:?}", n.violations());
}

/// STATUS is refused after IRP_MJ_CLEANUP like every other IOCTL. Seen failing on the
/// old code: it completed with STATUS_SUCCESS (its check ran before the closed check).
#[test]
fn status_after_cleanup_is_refused() {
    let fabric = Fabric::new(1, 24);
    let n = &fabric.nodes[0];
    let file = open(n, Caller::User);
    let s = ibcm_ioctl::StatusIn {
        size: ibcm_ioctl::StatusIn::SIZE,
        reserved: 0,
    };
    let out = ibcm_ioctl::StatusOut::SIZE as usize;
    must(n, file, code::STATUS, s.as_bytes(), out);
    n.device.cleanup(file);
    let done = n.ioctl_now(file, code::STATUS, s.as_bytes(), out);
    assert_eq!(done.status, status::FILE_CLOSED);
    n.close(file);
}

/// The cancel routine finds an endpoint's GET_EVENT through the handle's index of pending
/// requests (by request key), not by walking every endpoint: a process exiting with many
/// pending cancels each in one lookup. Every one of 2 000 completes with
/// STATUS_CANCELLED, once, and a request completed before its cancel is not touched.
#[test]
fn cancel_finds_each_pending_get_event() {
    let fabric = Fabric::new(1, 25);
    let n = &fabric.nodes[0];
    let user = open(n, Caller::Administrator);
    let ends: Vec<u64> = (0..2000).map(|_| create(n, user)).collect();
    let keys: Vec<u64> = ends
        .iter()
        .map(|&e| {
            n.ioctl(
                user,
                code::GET_EVENT,
                ibcm_host::records::handle_in(e).as_bytes(),
                user_handle::EV,
            )
        })
        .collect();
    for &k in keys.iter().rev() {
        assert!(n.completion(k).is_none());
        n.cancel(user, k);
        assert_eq!(n.completion(k).map(|d| d.status), Some(status::CANCELLED));
    }
    // A new GET_EVENT on an endpoint whose last one was cancelled pends and cancels too.
    let again = n.ioctl(
        user,
        code::GET_EVENT,
        ibcm_host::records::handle_in(ends[7]).as_bytes(),
        user_handle::EV,
    );
    n.cancel(user, again);
    assert_eq!(
        n.completion(again).map(|d| d.status),
        Some(status::CANCELLED)
    );
    n.close(user);
    assert!(n.violations().is_empty(), "{:?}", n.violations());
}

/// A user's CEPs in timewait count against its account (and all users') until they end:
/// destroying established connections and connecting again cannot hold more CEPs than
/// the budget. With an account budget of 4, four established connections destroyed
/// leave four CEPs in timewait (2 x packet life time + ACK delay), and the fifth CREATE
/// gets STATUS_QUOTA_EXCEEDED until they end; then it succeeds. Seen failing on the old
/// code (timewait uncounted): the fifth CREATE succeeded at once, and 40 rounds left the
/// user holding 40 CEPs under a budget of 4.
#[test]
fn a_users_timewaits_count_against_its_account_until_they_end() {
    let mut fabric = Fabric::new(2, 26);
    let quotas = ibcm_endpoint::Quotas {
        account_endpoints: 4,
        ..ibcm_endpoint::Quotas::default()
    };
    fabric.nodes[0].device.set_quotas(quotas);
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::Administrator);
    let l = create(n1, server);
    let mut li = ibcm_ioctl::ListenIn::new_zeroed();
    li.size = ibcm_ioctl::ListenIn::SIZE;
    li.handle = l;
    li.service_id = SERVICE;
    li.service_mask = u64::MAX;
    li.backlog = 16;
    must(n1, server, code::LISTEN, li.as_bytes(), 0);
    let user = open(&fabric.nodes[0], Caller::UserOf(7));
    let ceps = |f: &Fabric| f.nodes[0].device.with_engine(|cm| cm.live_ceps());
    for round in 0..4u32 {
        let n0 = &fabric.nodes[0];
        let e = create(n0, user);
        must(
            n0,
            user,
            code::CONNECT,
            connect_in(e, SERVICE, 0x600 + round).as_bytes(),
            0,
        );
        fabric.run_for(100_000);
        let n1 = &fabric.nodes[1];
        let s = user_handle::channel_events(n1, server)
            .iter()
            .find(|r| r.event_type == ibcm_ioctl::event_type::REQ_RECEIVED)
            .unwrap()
            .new_handle;
        must(
            n1,
            server,
            code::FORMAT_REP,
            ibcm_host::records::format_rep_in(s, 0x700 + round).as_bytes(),
            ibcm_ioctl::QpTransitionsOut::SIZE as usize,
        );
        must(
            n1,
            server,
            code::SEND_REP,
            ibcm_host::records::handle_in(s).as_bytes(),
            0,
        );
        fabric.run_for(100_000);
        let n0 = &fabric.nodes[0];
        let mut rtu = ibcm_ioctl::PrivateDataIn::new_zeroed();
        rtu.size = ibcm_ioctl::PrivateDataIn::SIZE;
        rtu.handle = e;
        must(n0, user, code::RTU, rtu.as_bytes(), 0);
        fabric.run_for(100_000);
        // Destroyed established: DREQ, DREP, then timewait.
        let n0 = &fabric.nodes[0];
        must(
            n0,
            user,
            code::DESTROY,
            ibcm_host::records::handle_in(e).as_bytes(),
            0,
        );
        fabric.run_for(100_000);
    }
    assert_eq!(ceps(&fabric), 4, "four CEPs in timewait");
    let n0 = &fabric.nodes[0];
    assert_eq!(n0.device.user_totals().account(7).endpoints, 4);
    assert_eq!(
        user_handle::try_create(n0, user),
        Err(status::QUOTA_EXCEEDED),
        "while its timewaits drain"
    );
    // Timewait: 2 x 4.096 us x 2^14 + the ACK delay: well under a second here.
    fabric.run_for(2_000_000_000);
    assert_eq!(ceps(&fabric), 0);
    let n0 = &fabric.nodes[0];
    assert_eq!(n0.device.user_totals().account(7).endpoints, 0);
    create(n0, user);
    n0.close(user);
    assert!(n0.violations().is_empty(), "{:?}", n0.violations());
}
