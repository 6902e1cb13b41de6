//! WDF objects: handles, parents and children, typed contexts, cleanup and destroy
//! callbacks, references, deletion. Handles are numbers the simulation never reuses, so a
//! deleted handle stays recognisably dead (KMDF Verifier's handle checks); contexts are
//! heap blocks freed at destruction, so a use after it is a use after free (which
//! AddressSanitizer reports at once).

use std::alloc::Layout;
use std::collections::HashMap;

use crate::thread;
use crate::verifier::{Rule, bugcheck};
use crate::{
    PFN_WDF_OBJECT_CONTEXT_CLEANUP, PFN_WDF_OBJECT_CONTEXT_DESTROY, PWDF_OBJECT_ATTRIBUTES,
    WDF_OBJECT_ATTRIBUTES,
};

/// What an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Driver,
    Device,
    Queue,
    Request,
    File,
    Timer,
    Dpc,
    WorkItem,
    WaitLock,
    Key,
}

/// One live object.
pub struct Object {
    pub kind: Kind,
    pub parent: usize,
    pub children: Vec<usize>,
    context: *mut u8,
    context_layout: Option<Layout>,
    type_info: usize,
    cleanup: PFN_WDF_OBJECT_CONTEXT_CLEANUP,
    destroy: PFN_WDF_OBJECT_CONTEXT_DESTROY,
    /// References the driver took (`WdfObjectReference`).
    pub references: i64,
    /// Deletion started: the cleanup callback has run or runs now.
    pub deleting: bool,
    /// Deletion is wanted once the object may go (a control device with open files).
    pub delete_pending: bool,
}

// SAFETY: the context pointer is a heap block owned by the object; the table is only
// reached under the simulation's lock.
unsafe impl Send for Object {}

#[derive(Default)]
pub struct Objects {
    next: usize,
    pub live: HashMap<usize, Object>,
    pub dead: HashMap<usize, Kind>,
}

/// Handles start here and step by this much (recognisable in a debugger, never null).
const HANDLE_BASE: usize = 0x5157_0000_0000;
const HANDLE_STEP: usize = 0x40;

impl Objects {
    /// A new object with `attributes` (null: none) under `parent` (0: none; the
    /// attributes' `ParentObject`, if set, wins). Returns its handle.
    pub fn create(
        &mut self,
        kind: Kind,
        attributes: PWDF_OBJECT_ATTRIBUTES,
        default_parent: usize,
        function: &str,
    ) -> usize {
        let attributes: Option<WDF_OBJECT_ATTRIBUTES> = if attributes.is_null() {
            None
        } else {
            // SAFETY: the driver passes a valid WDF_OBJECT_ATTRIBUTES (the WDF contract).
            Some(unsafe { *attributes })
        };
        let mut parent = default_parent;
        let (mut context, mut context_layout, mut type_info) = (std::ptr::null_mut(), None, 0);
        let (mut cleanup, mut destroy) = (None, None);
        if let Some(a) = attributes {
            if a.Size as usize != std::mem::size_of::<WDF_OBJECT_ATTRIBUTES>() {
                bugcheck(
                    Rule::Simulation,
                    format_args!("{function}: WDF_OBJECT_ATTRIBUTES.Size is {}", a.Size),
                );
            }
            if a.ExecutionLevel == 0 || a.SynchronizationScope == 0 {
                // WDF_OBJECT_ATTRIBUTES_INIT sets both to InheritFromParent; zero is invalid.
                bugcheck(
                    Rule::Simulation,
                    format_args!(
                        "{function}: attributes not initialised (ExecutionLevel or SynchronizationScope invalid)"
                    ),
                );
            }
            if !a.ParentObject.is_null() {
                parent = a.ParentObject as usize;
                self.get(parent, function);
            }
            if !a.ContextTypeInfo.is_null() {
                // SAFETY: a WDF_OBJECT_CONTEXT_TYPE_INFO the driver declared (static).
                let info = unsafe { *a.ContextTypeInfo };
                let size = if a.ContextSizeOverride != 0 {
                    a.ContextSizeOverride
                } else {
                    info.ContextSize
                };
                let layout = Layout::from_size_align(size.max(1), 16).unwrap_or_else(|_| {
                    bugcheck(
                        Rule::Simulation,
                        format_args!("{function}: context size {size}"),
                    )
                });
                // SAFETY: a non-zero size.
                context = unsafe { std::alloc::alloc_zeroed(layout) };
                context_layout = Some(layout);
                type_info = info.UniqueType as usize;
            }
            cleanup = a.EvtCleanupCallback;
            destroy = a.EvtDestroyCallback;
        }
        self.next += 1;
        let handle = HANDLE_BASE + self.next * HANDLE_STEP;
        if parent != 0 {
            self.get(parent, function).children.push(handle);
        }
        self.live.insert(
            handle,
            Object {
                kind,
                parent,
                children: Vec::new(),
                context,
                context_layout,
                type_info,
                cleanup,
                destroy,
                references: 0,
                deleting: false,
                delete_pending: false,
            },
        );
        handle
    }

    /// The live object `handle`; a dead or unknown handle is a bug check.
    pub fn get(&mut self, handle: usize, function: &str) -> &mut Object {
        if let Some(kind) = self.dead.get(&handle) {
            let kind = *kind;
            if kind == Kind::Request {
                bugcheck(
                    Rule::RequestCompleted,
                    format_args!(
                        "{function}: WDFREQUEST {handle:#x} used after its completion (no reference kept it)"
                    ),
                );
            }
            bugcheck(
                Rule::InvalidHandle,
                format_args!(
                    "{function}: {kind:?} handle {handle:#x} used after its object was deleted"
                ),
            );
        }
        match self.live.get_mut(&handle) {
            Some(o) => o,
            None => bugcheck(
                Rule::InvalidHandle,
                format_args!("{function}: {handle:#x} is not a WDF handle"),
            ),
        }
    }

    /// [`Self::get`], of kind `kind`.
    pub fn get_kind(&mut self, handle: usize, kind: Kind, function: &str) -> &mut Object {
        let o = self.get(handle, function);
        if o.kind != kind {
            let actual = o.kind;
            bugcheck(
                Rule::InvalidHandle,
                format_args!("{function}: {handle:#x} is a {actual:?}, not a {kind:?}"),
            );
        }
        o
    }

    /// The context of type `type_info` of `handle`.
    pub fn context(&mut self, handle: usize, type_info: usize, function: &str) -> *mut u8 {
        let o = self.get(handle, function);
        if o.type_info != type_info || o.context.is_null() {
            let kind = o.kind;
            bugcheck(
                Rule::ContextType,
                format_args!(
                    "{function}: the {kind:?} {handle:#x} has no context of type info {type_info:#x}"
                ),
            );
        }
        o.context
    }

    /// The subtree under `handle`, children before parents (KMDF disposes children first).
    pub fn subtree(&self, handle: usize) -> Vec<usize> {
        let mut out = Vec::new();
        self.collect(handle, &mut out);
        out
    }

    fn collect(&self, handle: usize, out: &mut Vec<usize>) {
        if let Some(o) = self.live.get(&handle) {
            for c in &o.children {
                self.collect(*c, out);
            }
            out.push(handle);
        }
    }

    /// Starts deleting `handle`: returns its cleanup callback (to run without the lock),
    /// or None when it was already being deleted.
    pub fn begin_delete(&mut self, handle: usize) -> Option<PFN_WDF_OBJECT_CONTEXT_CLEANUP> {
        let o = self.live.get_mut(&handle)?;
        if o.deleting {
            return None;
        }
        o.deleting = true;
        Some(o.cleanup)
    }

    /// Ends an object whose cleanup ran, if no reference holds it: unlinks it from its
    /// parent and returns what to run and free without the lock.
    pub fn finish(&mut self, handle: usize) -> Option<Finished> {
        let o = self.live.get(&handle)?;
        if !o.deleting || o.references > 0 || !o.children.is_empty() {
            return None;
        }
        let o = self.live.remove(&handle)?;
        if let Some(p) = self.live.get_mut(&o.parent) {
            p.children.retain(|c| *c != handle);
        }
        self.dead.insert(handle, o.kind);
        Some(Finished {
            handle,
            destroy: o.destroy,
            context: o.context,
            layout: o.context_layout,
            parent: o.parent,
        })
    }
}

/// An object removed from the table: its destroy callback runs, then its context is freed.
pub struct Finished {
    pub handle: usize,
    destroy: PFN_WDF_OBJECT_CONTEXT_DESTROY,
    context: *mut u8,
    layout: Option<Layout>,
    pub parent: usize,
}

impl Finished {
    /// Runs the destroy callback (driver code) and frees the context.
    pub fn run(self) {
        if let Some(destroy) = self.destroy {
            let level = thread::irql();
            thread::call_driver("EvtDestroyCallback", level, || {
                // SAFETY: the driver's destroy callback, with the object being destroyed.
                unsafe { destroy(self.handle as *mut core::ffi::c_void) }
            });
        }
        if let Some(layout) = self.layout {
            crate::lockorder::forget(self.context as usize, layout.size());
            // Poisoned before it goes, so a stale pointer reads garbage even without ASan.
            // SAFETY: the context block allocated with this layout in `create`.
            unsafe { std::ptr::write_bytes(self.context, 0xDD, layout.size()) };
            // SAFETY: as above, freed once (the object left the table).
            unsafe { std::alloc::dealloc(self.context, layout) };
        }
    }
}
