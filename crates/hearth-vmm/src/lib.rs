//! hearth-vmm
