//! CPU time from `/proc`: a process's (`/proc/PID/stat`) or one
//! thread's (`/proc/PID/task/TID/stat`), user plus system, in seconds.

use std::path::Path;

/// User plus system CPU seconds of the `stat` file at `path`.
pub fn cpu_seconds(path: &Path) -> Result<f64, String> {
    let stat = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("bad stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("bad stat")
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11)? + ticks(12)?) as f64 / hz)
}

/// A thread's name (`comm`) from its `/proc/PID/task/TID` directory.
pub fn thread_name(task: &Path) -> Option<String> {
    std::fs::read_to_string(task.join("comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}
