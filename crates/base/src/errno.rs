//! POSIX error numbers as they travel on the wire and reach applications.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A positive Linux errno value. Replies carry it negated in the header's status field.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Errno(pub i32);

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno(libc::$name);
            )*
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EINTR,
    EIO,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    EMLINK,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENODATA,
    EPROTO,
    EOVERFLOW,
    EOPNOTSUPP,
    ENOTCONN,
    ETIMEDOUT,
    ESTALE,
    E2BIG,
    ESHUTDOWN,
    ECONNREFUSED,
    EALREADY,
    EINPROGRESS,
    ENOTSUP,
    ENOLCK,
    EDEADLK,
    EDQUOT,
    ENXIO,
    ECANCELED
);

impl Errno {
    /// The raw positive value.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// Maps an I/O error to the errno an application should see; unknown kinds are EIO.
    pub fn from_io(e: &std::io::Error) -> Errno {
        match e.raw_os_error() {
            Some(n) if n > 0 => Errno(n),
            _ => match e.kind() {
                std::io::ErrorKind::NotFound => Errno::ENOENT,
                std::io::ErrorKind::PermissionDenied => Errno::EACCES,
                std::io::ErrorKind::AlreadyExists => Errno::EEXIST,
                std::io::ErrorKind::InvalidInput => Errno::EINVAL,
                std::io::ErrorKind::TimedOut => Errno::ETIMEDOUT,
                _ => Errno::EIO,
            },
        }
    }

    /// Builds an errno from a wire status (negative errno); 0 and garbage map to EIO.
    pub fn from_status(status: i32) -> Errno {
        if status < 0 && status > -4096 {
            Errno(-status)
        } else {
            Errno::EIO
        }
    }

    /// The wire status for this errno (negative).
    pub fn status(self) -> i32 {
        -self.0
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            std::io::Error::from_raw_os_error(self.0),
            self.0
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = std::io::Error::from_raw_os_error(self.0).to_string();
        // std appends " (os error N)"; keep the words only.
        let words = s.split(" (os error").next().unwrap_or(&s);
        f.write_str(words)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip() {
        assert_eq!(Errno::from_status(Errno::ENOENT.status()), Errno::ENOENT);
        assert_eq!(Errno::from_status(0), Errno::EIO);
        assert_eq!(Errno::from_status(i32::MIN), Errno::EIO);
        assert_eq!(Errno::ENOENT.to_string(), "No such file or directory");
    }
}
