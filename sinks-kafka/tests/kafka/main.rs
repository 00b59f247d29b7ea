//! Tests against a real broker.
