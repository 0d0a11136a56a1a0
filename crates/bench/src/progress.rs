//! A one-line progress display on stderr, only when stderr is a terminal.

use std::io::Write;

/// Progress display.
pub struct Progress {
    tty: bool,
}

impl Progress {
    /// Shows progress only if stderr is a terminal.
    pub fn new() -> Progress {
        // SAFETY: isatty only inspects the descriptor.
        Progress {
            tty: unsafe { libc::isatty(2) } == 1,
        }
    }

    /// Shows the current step.
    pub fn show(&self, what: &str) {
        if self.tty {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K[lode bench] {what}");
            let _ = e.flush();
        }
    }

    /// Erases the line.
    pub fn clear(&self) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}
