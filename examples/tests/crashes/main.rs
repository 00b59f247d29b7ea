//! The custom sink certified by the kit, which sets crash points: they are
//! process-wide, so this test has an executable of its own.

mod custom_sink_certified;
