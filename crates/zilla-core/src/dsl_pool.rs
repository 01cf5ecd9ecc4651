//! dsl_pool (ENGINE: being written)
pub const TUNABLES: &[crate::kstat::TunableDef] = &[];
