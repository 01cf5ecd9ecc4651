"""Zilla benchmark harness library (bench/run is the runner; ARCHITECTURE.md section 8).

Modules, lowest first (a module imports only modules above it in this list):

    proc      logging, subprocesses, cleanup of everything we start, temp dirs
    machine   machine facts, load average, /proc readings, tool versions
    tables    number formatting, text tables, medians and ratios
    goals     the `goals` record every scenario writes
    packages  Debian packages from tests/packages.txt (shared with tests/run)
    build     the zilla binaries: this tree's, and an old revision built under /tmp
    admin     admin API client (unix socket); iostat read by class name
    daemon    a zilla daemon and an nbdkit server as managed processes
    fio       fio runs summarised, NBD flush, leaf queue sampling

Python standard library only.
"""
