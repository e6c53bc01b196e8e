//! api placeholder
