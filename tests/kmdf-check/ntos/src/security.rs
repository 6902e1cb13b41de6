//! Tokens, the subject context of a create, and the I/O manager's access check of a
//! device's SDDL (the subset of SDDL that device security descriptors use: a protected
//! DACL of allow ACEs with generic rights for well-known SIDs).

use crate::state;
use crate::thread::{KernelCode, PASSIVE, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::{BOOLEAN, PACCESS_TOKEN, PSECURITY_SUBJECT_CONTEXT};

/// A token as the tests make it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Token {
    /// An elevated member of Administrators (BA enabled).
    pub admin: bool,
    /// A restricted token (its restricting SIDs: RC, restricted code).
    pub restricted: bool,
    /// LocalSystem (SY).
    pub system: bool,
}

impl Token {
    pub const USER: Token = Token {
        admin: false,
        restricted: false,
        system: false,
    };
    pub const ADMIN: Token = Token {
        admin: true,
        restricted: false,
        system: false,
    };
    pub const RESTRICTED_ADMIN: Token = Token {
        admin: true,
        restricted: true,
        system: false,
    };
    pub const SYSTEM: Token = Token {
        admin: true,
        restricted: false,
        system: true,
    };

    /// The token as a PACCESS_TOKEN (kept for the process's life).
    pub fn leak(self) -> PACCESS_TOKEN {
        let _k = KernelCode::enter();
        let token = Box::new(self);
        let p = &*token as *const Token as usize;
        state::lock().io.tokens.insert(p, token);
        p as PACCESS_TOKEN
    }
}

fn token_of(token: PACCESS_TOKEN, function: &str) -> Token {
    match state::lock().io.tokens.get(&(token as usize)) {
        Some(t) => **t,
        None => bugcheck(
            Rule::Simulation,
            format_args!("{function}: {token:p} is not a token"),
        ),
    }
}

pub const GENERIC_READ: u32 = 0x8000_0000;
pub const GENERIC_WRITE: u32 = 0x4000_0000;
pub const GENERIC_EXECUTE: u32 = 0x2000_0000;
pub const GENERIC_ALL: u32 = 0x1000_0000;

/// The rights `sddl` grants `token` (generic rights; GA grants all).
pub fn granted(sddl: &str, token: Token) -> u32 {
    let mut normal = 0;
    let mut restricting = 0;
    for ace in sddl.split('(').skip(1) {
        let fields: Vec<&str> = ace.trim_end_matches(')').split(';').collect();
        let [kind, _, rights, _, _, sid] = fields[..] else {
            continue;
        };
        if kind != "A" {
            continue;
        }
        let mut mask = 0;
        for r in rights.as_bytes().chunks(2) {
            mask |= match r {
                b"GA" => GENERIC_ALL | GENERIC_READ | GENERIC_WRITE | GENERIC_EXECUTE,
                b"GR" => GENERIC_READ,
                b"GW" => GENERIC_WRITE,
                b"GX" => GENERIC_EXECUTE,
                _ => 0,
            };
        }
        let member = match sid {
            "WD" => true,
            "BA" => token.admin,
            "SY" => token.system,
            _ => false,
        };
        if member {
            normal |= mask;
        }
        // A restricted token is checked a second time against its restricting SIDs.
        if sid == "RC" {
            restricting |= mask;
        }
    }
    if token.restricted {
        normal & restricting
    } else {
        normal
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn SeLockSubjectContext(SubjectContext: PSECURITY_SUBJECT_CONTEXT) {
    let _k = KernelCode::enter();
    require_irql("SeLockSubjectContext", PASSIVE);
    *state::lock()
        .io
        .subject_locks
        .entry(SubjectContext as usize)
        .or_default() += 1;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn SeUnlockSubjectContext(SubjectContext: PSECURITY_SUBJECT_CONTEXT) {
    let _k = KernelCode::enter();
    require_irql("SeUnlockSubjectContext", PASSIVE);
    let mut guard = state::lock();
    let count = guard
        .io
        .subject_locks
        .entry(SubjectContext as usize)
        .or_default();
    *count -= 1;
    if *count < 0 {
        drop(guard);
        bugcheck(
            Rule::SubjectContext,
            format_args!("SeUnlockSubjectContext without SeLockSubjectContext"),
        );
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn SeTokenIsAdmin(Token: PACCESS_TOKEN) -> BOOLEAN {
    let _k = KernelCode::enter();
    require_irql("SeTokenIsAdmin", PASSIVE);
    // SeTokenIsAdmin looks at the Administrators group alone: a restricted token made from
    // an administrator's answers TRUE (why the binding also asks SeTokenIsRestricted).
    BOOLEAN::from(token_of(Token, "SeTokenIsAdmin").admin)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn SeTokenIsRestricted(Token: PACCESS_TOKEN) -> BOOLEAN {
    let _k = KernelCode::enter();
    require_irql("SeTokenIsRestricted", PASSIVE);
    BOOLEAN::from(token_of(Token, "SeTokenIsRestricted").restricted)
}
