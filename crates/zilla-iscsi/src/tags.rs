//! tags: the task tags of commands that ended before all their Data-Out came.
//!
//! Theory of operation
//! -------------------
//! A command can end while its initiator is still sending its data: refused before
//! its data phase (a CDB in error, a reservation conflict, a bidirectional command, a
//! CmdSN outside the window), failed during it (a Data-Out out of sequence, a bad data
//! digest) or aborted by task management. The initiator may have more Data-Out for it
//! on the way (unsolicited data after a command without the F bit, the rest of a
//! burst): those PDUs are expected, and the connection drops them without a word. A
//! Data-Out whose tag is neither a command waiting for data nor one of these is the
//! initiator's error and is answered with a Reject.
//!
//! [`EndedTags`] keeps the last `capacity` such tags (the CmdSN window plus the PDUs a
//! connection defers: no more commands than that can have data on the way), oldest
//! forgotten first; a tag leaves when a new command takes it.

use std::collections::VecDeque;

/// The bounded set of tags whose stray Data-Out is dropped.
pub(crate) struct EndedTags {
    tags: VecDeque<u32>,
    capacity: usize,
}

impl EndedTags {
    pub(crate) fn new(capacity: usize) -> EndedTags {
        EndedTags { tags: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// The command of `itt` ended with Data-Out possibly still on the way.
    pub(crate) fn note(&mut self, itt: u32) {
        if self.tags.contains(&itt) {
            return;
        }
        if self.tags.len() >= self.capacity {
            self.tags.pop_front();
        }
        self.tags.push_back(itt);
    }

    pub(crate) fn contains(&self, itt: u32) -> bool {
        self.tags.contains(&itt)
    }

    /// A new command took `itt`: its Data-Out is its own.
    pub(crate) fn reuse(&mut self, itt: u32) {
        if !self.tags.is_empty() {
            self.tags.retain(|&t| t != itt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_kept_until_reused_or_pushed_out() {
        let mut ended = EndedTags::new(2);
        ended.note(1);
        ended.note(1);
        ended.note(2);
        assert!(ended.contains(1) && ended.contains(2));
        ended.note(3);
        assert!(!ended.contains(1), "the oldest goes first");
        assert!(ended.contains(2) && ended.contains(3));
        ended.reuse(3);
        assert!(!ended.contains(3));
        assert_eq!(ended.tags.len(), 1);
    }
}
