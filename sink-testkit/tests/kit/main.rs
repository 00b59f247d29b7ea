//! The kit's own tests: broken sinks it must catch, the shipped sinks it
//! must pass. One executable, each file a module (every test here sets
//! crash points through the kit, which runs one certification at a time);
//! `hostile_state` has its own, for its counting allocator.

mod broken_global;
mod broken_sinks;
mod certify_builtin;
mod handover;
