//! Leaf devices backed by a regular file or a block device (HELPER: implement).
use std::io;
use std::path::Path;

pub struct FileDevice {}

impl FileDevice {
    /// Open read-write; O_DIRECT where the file system allows it, else buffered.
    pub fn open(_path: &Path) -> io::Result<FileDevice> {
        todo!()
    }
}

impl super::Device for FileDevice {
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<()> { todo!() }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> { todo!() }
    fn flush(&self) -> io::Result<()> { todo!() }
    fn size(&self) -> u64 { todo!() }
    fn rotational(&self) -> bool { false }
    fn kind(&self) -> String { "file".into() }
}
