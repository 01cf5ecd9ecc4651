//! arc (ENGINE: being written)
pub const TUNABLES: &[crate::kstat::TunableDef] = &[];
