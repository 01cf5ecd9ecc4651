//! label (ENGINE)
