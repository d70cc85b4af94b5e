//! Descriptors this test process inherited are not passed on to the daemons
//! it starts. A CI runner may leave hundreds open without close-on-exec;
//! passed on, they would count against a daemon's open-file limit (the
//! fd-limit test lowers it to 96) and hold pipes open past a daemon's exit.
//!
//! The one `unsafe` here borrows a descriptor number read from
//! `/proc/self/fd` for a single `fcntl` call.
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::sync::Once;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

/// Marks every descriptor above stderr close-on-exec, once per process.
pub fn keep_from_children() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return;
        };
        let numbers: Vec<i32> = entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect();
        for raw in numbers {
            // SAFETY: `raw` was listed as open a moment ago and the borrow
            // lasts for two fcntl calls. If another thread closed it since,
            // fcntl fails with EBADF, which is ignored; if the number was
            // reused, it names a descriptor Rust opened close-on-exec
            // already, and setting the flag again changes nothing.
            let fd = unsafe { BorrowedFd::borrow_raw(raw) };
            if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFD) {
                let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
                let _ = fcntl(fd, FcntlArg::F_SETFD(flags));
            }
        }
    });
}
