//! A result larger than the memory it is written in: `simjoin self-join --unsorted` writes
//! gigabytes of pairs to .npy (up to 4.5 GB, a third of the free disk at most) with a peak
//! resident set under a quarter of the file, and the file read back holds exactly the pairs
//! of the same join run in memory-free counting form.

use simjoin::{Dataset, Engine, JoinOptions, Pair};
use std::io::BufReader;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_simjoin");

/// An order-independent digest of a set of pairs: the wrapping sum of a mix of each pair.
fn digest(pairs: impl IntoIterator<Item = Pair>) -> (u64, u64) {
    let mut count = 0u64;
    let mut sum = 0u64;
    for [i, j] in pairs {
        // splitmix64's finaliser: every bit of the pair moves every bit of the term.
        let mut z = ((i as u64) << 32 | j as u64).wrapping_add(0x9e3779b97f4a7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        sum = sum.wrapping_add(z ^ (z >> 31));
        count += 1;
    }
    (count, sum)
}

/// Runs `simjoin args` to completion; its exit status, stdout and peak RSS in bytes.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also gives its resource usage"
)]
fn run_measured(dir: &std::path::Path, args: &[&str]) -> (bool, String, u64) {
    let child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut stdout).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of that plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child (not yet reaped: `Child` is not waited on), writing
    // into the two locals above.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    // Linux reports ru_maxrss in KiB.
    (ok, stdout, usage.ru_maxrss as u64 * 1024)
}

/// Bytes free to an unprivileged writer on the file system holding `dir`.
fn free_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is a valid value of that plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a writable statvfs, both live.
    let r = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statvfs: {}", std::io::Error::last_os_error());
    st.f_bavail as u64 * st.f_frsize as u64
}

#[test]
fn gigabytes_of_unsorted_pairs_in_a_fraction_of_their_size() {
    let dir = std::env::temp_dir().join(format!("simjoin-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The file is as large as a third of the free disk allows (a CI machine's disk is
    // mostly build output), 256 MB at least, 4.5 GB at most: a uniform square of n points
    // holds ~n^2/2 * pi * eps^2 pairs (less near the edges), 8 bytes each.
    let target = (free_bytes(&dir) / 3).clamp(256 << 20, 4_500_000_000);
    let n = 300_000usize;
    let eps_value =
        (target as f64 / 8.0 / (n as f64 * n as f64 / 2.0 * std::f64::consts::PI)).sqrt() * 1.04;
    let eps = format!("{eps_value:.4}");
    let eps_value: f64 = eps.parse().unwrap();
    let mut s = 7u64;
    let pts: Vec<f32> = (0..2 * n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    {
        use npyz::WriterBuilder;
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&[n as u64, 2])
            .writer(std::fs::File::create(dir.join("x.npy")).unwrap())
            .begin_nd()
            .unwrap();
        w.extend(pts.iter().copied()).unwrap();
        w.finish().unwrap();
    }
    let (ok, stats, peak) = run_measured(
        &dir,
        &[
            "self-join",
            "x.npy",
            "--eps",
            &eps,
            "--backend",
            "cpu",
            "--unsorted",
            "-o",
            "big.npy",
            "--stats",
        ],
    );
    let path = dir.join("big.npy");
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    // Read the file back, streaming: the header's shape, every pair in range, the digest.
    let read_back = ok.then(|| {
        let npy = npyz::NpyFile::new(BufReader::with_capacity(
            1 << 22,
            std::fs::File::open(&path).unwrap(),
        ))
        .unwrap();
        let shape = npy.shape().to_vec();
        let mut values = npy.data::<u32>().unwrap().map(Result::unwrap);
        let pairs = std::iter::from_fn(|| Some([values.next()?, values.next().unwrap()]));
        let d = digest(pairs.inspect(|&[i, j]| assert!(i < j && (j as usize) < n)));
        (shape, d)
    });
    let count = Command::new(BIN)
        .args(["self-join", "x.npy", "--eps", &eps, "--backend", "cpu"])
        .current_dir(&dir)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(ok, "simjoin failed");
    let (shape, got) = read_back.unwrap();
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    eprintln!(
        "eps {eps}: {size} bytes (target {target}), {} pairs, peak RSS {:.1} MiB, join {:.1} s, write {:.1} s",
        stats["pairs"],
        peak as f64 / (1 << 20) as f64,
        stats["seconds"].as_f64().unwrap(),
        stats["write_seconds"].as_f64().unwrap()
    );
    assert!(size >= target * 4 / 5, "only {size} bytes of {target}");
    assert_eq!(stats["output_bytes"], size);
    assert!(
        peak < size / 4,
        "peak RSS {peak} bytes for a {size}-byte file"
    );
    assert_eq!(shape, [got.0, 2]);

    // The count-only join, and the same join's pairs digested as they stream (never
    // stored), agree with the file.
    assert!(count.status.success());
    assert_eq!(
        String::from_utf8_lossy(&count.stdout).trim(),
        got.0.to_string()
    );
    let data = Dataset::from_f32(&pts, 2).unwrap();
    let mut opts = JoinOptions::new(eps_value);
    opts.backend = simjoin::Backend::Cpu;
    let mut want = (0u64, 0u64);
    let mut sink = |chunk: &[Pair]| -> anyhow::Result<()> {
        let (c, d) = digest(chunk.iter().copied());
        want = (want.0 + c, want.1.wrapping_add(d));
        Ok(())
    };
    Engine::new()
        .self_join_stream(&data, &opts, &mut sink)
        .unwrap();
    assert_eq!(got, want, "(count, digest) read back vs the join's own");
}
