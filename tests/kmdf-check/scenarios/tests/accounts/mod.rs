//! Budgets per account through the binding: the account of a handle is its opener's
//! token user SID (`SeQueryInformationToken(TokenUser)` at IRP_MJ_CREATE, the block given
//! back with `ExFreePool`), so every handle of one user shares that user's share of the
//! all-users budgets, and another user keeps its own (docs/security.md, "A local user").

use super::*;

/// `MaxEndpointsPerAccount` 3: one user's two handles hold 3 endpoints between them and
/// the fourth is refused on either; another user's handle still gets its 3; an
/// administrator is not counted.
pub fn endpoints_are_budgeted_per_account() {
    let device = boot(&[("MaxEndpointsPerAccount", 3)]);
    let (one, two) = (open(Open::user(Token::USER)), open(Open::user(Token::USER)));
    assert!(create(one).is_ok() && create(two).is_ok() && create(one).is_ok());
    for file in [one, two] {
        assert_eq!(
            create(file),
            Err(status::QUOTA_EXCEEDED),
            "the account's three endpoints are taken, whichever handle asks"
        );
    }
    let other = open(Open::user(Token::OTHER_USER));
    for _ in 0..3 {
        assert!(create(other).is_ok(), "another account has its own share");
    }
    assert_eq!(create(other), Err(status::QUOTA_EXCEEDED));
    let admin = open(Open::user(Token::ADMIN));
    assert!(create(admin).is_ok(), "an administrator is not counted");
    for f in [one, two, other, admin] {
        io::close(f);
    }
    shutdown(device);
}

/// A user's CREATE refused over its handle's quota is counted in COUNTERS and written to
/// the System log (`IBCM_REFUSED`, with the count); the next refusals within the minute
/// add no entry (one a minute at most: a user looping over a quota cannot flood the log).
pub fn refusals_reach_the_system_log_at_a_limited_rate() {
    let device = boot(&[("MaxEndpointsPerHandle", 1)]);
    let file = open(Open::user(Token::USER));
    assert!(create(file).is_ok());
    for _ in 0..5 {
        assert_eq!(create(file), Err(status::QUOTA_EXCEEDED));
    }
    let refused = ibcm_eventlog::REFUSED.code() as i32;
    let entries: Vec<Vec<String>> = io::system_log()
        .into_iter()
        .filter(|(code, _)| *code == refused)
        .map(|(_, strings)| strings)
        .collect();
    assert_eq!(
        entries,
        vec![vec!["1".to_string(), "0".to_string()]],
        "one entry, for the first refusal: the other four wait for the next minute"
    );
    io::close(file);
    shutdown(device);
}
