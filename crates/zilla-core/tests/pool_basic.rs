mod common;
use common::*;

#[test]
fn write_export_import_read() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 32 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let data = pattern(1, 1 << 20);
    v.write(4096, &data, false).unwrap();
    let mut back = vec![0u8; 1 << 20];
    v.read(4096, &mut back).unwrap();
    assert_eq!(back, data, "read back from dirty data");
    v.flush().unwrap();
    v.read(4096, &mut back).unwrap();
    assert_eq!(back, data, "read back after sync");
    let st = v.block_status(0, 32 << 20).unwrap();
    assert!(st.iter().any(|e| !e.hole));
    assert!(st.last().unwrap().hole);
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("vol").unwrap();
    let mut back = vec![0u8; 1 << 20];
    v.read(4096, &mut back).unwrap();
    assert_eq!(back, data, "read back after import");
    let mut z = vec![1u8; 4096];
    v.read(0, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    v.unmap(0, 2 << 20).unwrap();
    v.read(4096, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    assert!(v.write(32 << 20, &[0u8; 512], false).is_err());
    pool.export().unwrap();
}
