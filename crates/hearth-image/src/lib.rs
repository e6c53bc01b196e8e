//! hearth-image
