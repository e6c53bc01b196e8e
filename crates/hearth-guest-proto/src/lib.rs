//! hearth-guest-proto
