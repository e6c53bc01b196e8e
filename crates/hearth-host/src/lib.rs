//! hearth-host
