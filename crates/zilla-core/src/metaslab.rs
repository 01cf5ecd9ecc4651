//! metaslab (ENGINE: being written)
