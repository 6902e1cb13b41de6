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
    /// The last sub-authority of the user's SID: S-1-5-21-1111-2222-3333-`account`
    /// (LocalSystem's is S-1-5-18).
    pub account: u32,
}

impl Token {
    pub const USER: Token = Token {
        admin: false,
        restricted: false,
        system: false,
        account: 1001,
    };
    /// Another ordinary user: an account of its own.
    pub const OTHER_USER: Token = Token {
        account: 1002,
        ..Token::USER
    };
    pub const ADMIN: Token = Token {
        admin: true,
        restricted: false,
        system: false,
        account: 500,
    };
    pub const RESTRICTED_ADMIN: Token = Token {
        admin: true,
        restricted: true,
        system: false,
        account: 500,
    };
    pub const SYSTEM: Token = Token {
        admin: true,
        restricted: false,
        system: true,
        account: 18,
    };

    /// The user SID's bytes (revision 1, the NT authority, the sub-authorities).
    pub fn sid(self) -> Vec<u8> {
        let subs: &[u32] = if self.system {
            &[18]
        } else {
            &[21, 1111, 2222, 3333, self.account]
        };
        let mut b = vec![1, subs.len() as u8, 0, 0, 0, 0, 0, 5];
        for sub in subs {
            b.extend_from_slice(&sub.to_le_bytes());
        }
        b
    }

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

/// `SeQueryInformationToken` (ntifs.h; PASSIVE_LEVEL) for `TokenUser`: a TOKEN_USER and
/// its SID in one block of pool the caller frees with `ExFreePool` (what is not freed by
/// unload is a leak).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn SeQueryInformationToken(
    Token: PACCESS_TOKEN,
    TokenInformationClass: crate::TOKEN_INFORMATION_CLASS,
    TokenInformation: *mut crate::PVOID,
) -> crate::NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("SeQueryInformationToken", PASSIVE);
    if TokenInformationClass != crate::_TOKEN_INFORMATION_CLASS::TokenUser {
        return crate::STATUS_NOT_SUPPORTED;
    }
    let sid = token_of(Token, "SeQueryInformationToken").sid();
    // The TOKEN_USER first, the SID right after it, in u64s (the SID's alignment is 4).
    let header = size_of::<crate::TOKEN_USER>();
    let mut block = vec![0u64; (header + sid.len()).div_ceil(8)].into_boxed_slice();
    let base = block.as_mut_ptr().cast::<u8>();
    // SAFETY: the block holds the header and the SID bytes after it.
    let sid_at = unsafe { base.add(header) };
    // SAFETY: as above: `sid.len()` bytes fit from `sid_at`.
    unsafe { core::ptr::copy_nonoverlapping(sid.as_ptr(), sid_at, sid.len()) };
    let user = crate::TOKEN_USER {
        User: crate::SID_AND_ATTRIBUTES {
            Sid: sid_at.cast(),
            Attributes: 0,
        },
    };
    // SAFETY: the block starts with room for a TOKEN_USER, 8-aligned.
    unsafe { base.cast::<crate::TOKEN_USER>().write(user) };
    // SAFETY: the caller's out pointer.
    unsafe { *TokenInformation = base.cast() };
    state::lock()
        .io
        .token_information
        .insert(base as usize, block);
    crate::STATUS_SUCCESS
}

/// Frees what `SeQueryInformationToken` returned; false if `p` is not such a block.
pub fn free_token_information(p: usize) -> bool {
    state::lock().io.token_information.remove(&p).is_some()
}
