//! The listen table's room and its bytes: a LISTEN at DISPATCH_LEVEL (the kernel-client
//! interface's `listen_fixed`) allocates nothing once `reserve_listens` made room at
//! PASSIVE_LEVEL, however the listens before it came and went; and `memory()` counts what
//! the table holds.

use ibcm_cep::pair::GUID_B;
use ibcm_cep::{CmConfig, CmManager, Instant, ListenParams};

const ROOM: usize = 64;

fn listen(service_id: u64, service_mask: u64) -> ListenParams {
    ListenParams {
        service_id,
        service_mask,
        port: None,
        compare: Some((0, vec![0xAB, 0xCD])),
        backlog: 4,
    }
}

#[test]
fn listens_within_the_reserved_room_allocate_nothing() {
    let mut cm = CmManager::new(CmConfig::new(GUID_B, [2; 32]));
    cm.reserve(4 * ROOM).unwrap();
    cm.reserve_listens(ROOM).unwrap();
    assert!(cm.listen_room() >= ROOM);
    let mut next_id = 0x1000u64;
    // Rounds of ROOM listens (exact ones and a few partial-mask ones), all destroyed again:
    // the table's deleted entries must not make a later round allocate.
    for round in 0..200 {
        let ceps: Vec<_> = (0..ROOM).map(|_| cm.create().unwrap()).collect();
        let params: Vec<_> = (0..ROOM)
            .map(|k| {
                next_id += 0x100;
                let mask = if k % 16 == 0 { !0xff } else { u64::MAX };
                listen(next_id, mask)
            })
            .collect();
        let info = allocation_counter::measure(|| {
            for (&cep, p) in ceps.iter().zip(params) {
                cm.listen(cep, p).unwrap();
            }
            for &cep in &ceps {
                cm.destroy(Instant::default(), cep).unwrap();
            }
        });
        assert_eq!(info.count_total, 0, "round {round}");
    }
}

#[test]
fn memory_counts_the_listen_table() {
    let mut cm = CmManager::new(CmConfig::new(GUID_B, [2; 32]));
    let before = cm.memory().total();
    let info = allocation_counter::measure(|| cm.reserve_listens(10_000).unwrap());
    assert!(info.bytes_current > 0);
    assert_eq!(
        (cm.memory().total() - before) as i64,
        info.bytes_current,
        "{:?}",
        cm.memory()
    );
    // Listens with compare buffers: the table allocates nothing more, and the buffers
    // are counted as private data.
    let ceps: Vec<_> = (0..1000).map(|_| cm.create().unwrap()).collect();
    let tables = cm.memory().tables();
    let private_data = cm.memory().private_data;
    for (k, &cep) in ceps.iter().enumerate() {
        cm.listen(cep, listen(0x10_0000 + k as u64, u64::MAX))
            .unwrap();
    }
    assert_eq!(cm.memory().tables(), tables);
    assert_eq!(cm.memory().private_data, private_data + 1000 * 2);
}
