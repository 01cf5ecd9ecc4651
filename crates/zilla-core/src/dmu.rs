//! dmu (ENGINE: being written)
