//! mirror (ENGINE)
