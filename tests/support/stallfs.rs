//! A FUSE passthrough filesystem whose fsync and fdatasync can be made to hang on demand: the
//! "disk stuck in fdatasync" of etcd#15247 / #12528, for one etcd member at a time.
//!
//! Every operation goes straight to a backing directory; only syncs pass through a gate. While
//! the gate is shut, each fsync, fdatasync and directory fsync waits (on a thread of its own, so
//! reads, writes and everything else go on), and [`StallFs::waiting`] counts them: a member whose
//! raft loop is blocked shows here as one waiting sync. Opening the gate lets them all finish.
//! Served by threads of the test process; dropping the value opens the gate and unmounts.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

/// Attributes and names are never cached by the kernel: etcd's files change under it.
const NO_CACHE: Duration = Duration::ZERO;

/// A mounted stall filesystem.
pub struct StallFs {
    gate: Arc<Gate>,
    session: Option<BackgroundSession>,
}

impl StallFs {
    /// Mount a passthrough of `backing` (created if missing) at `mountpoint` (likewise). Panics
    /// with what is missing when FUSE cannot be used: the F14 tests need it and must not skip.
    #[track_caller]
    pub fn mount(backing: &Path, mountpoint: &Path) -> StallFs {
        assert!(
            Path::new("/dev/fuse").exists(),
            "FUSE is missing: /dev/fuse does not exist (load the fuse module; the F14 stall \
             tests need it)"
        );
        fs::create_dir_all(backing).unwrap();
        fs::create_dir_all(mountpoint).unwrap();
        let gate = Arc::new(Gate::default());
        let fs = Passthrough::new(backing, gate.clone());
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("leasewrap-stallfs".into())];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(fs, mountpoint, &config).unwrap_or_else(|e| {
            panic!(
                "cannot mount the FUSE stall filesystem at {}: {e} (as root it mounts directly; \
                 otherwise it needs fusermount3 from Debian's fuse3, which scripts/test.sh installs)",
                mountpoint.display()
            )
        });
        StallFs {
            gate,
            session: Some(session),
        }
    }

    /// From now on every sync waits until [`StallFs::release`].
    pub fn stall(&self) {
        self.gate.set(true);
    }

    /// Let every waiting and later sync through.
    pub fn release(&self) {
        self.gate.set(false);
    }

    /// How many syncs are waiting at the shut gate now.
    pub fn waiting(&self) -> usize {
        self.gate.state.lock().unwrap().waiting
    }
}

impl Drop for StallFs {
    fn drop(&mut self) {
        self.release();
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

/// Detach every mount below `dir` (stall filesystems of a test process that died: their FUSE
/// connection is gone, and a directory holding one cannot be removed until it is unmounted).
pub fn unmount_everything_under(dir: &Path) {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for point in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
        if Path::new(point).starts_with(dir) {
            let _ = std::process::Command::new("umount")
                .args(["-l", point])
                .status();
        }
    }
}

/// The gate every sync passes.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Default)]
struct GateState {
    shut: bool,
    waiting: usize,
}

impl Gate {
    fn set(&self, shut: bool) {
        self.state.lock().unwrap().shut = shut;
        self.opened.notify_all();
    }

    /// Return once the gate is open.
    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        if !s.shut {
            return;
        }
        s.waiting += 1;
        while s.shut {
            s = self.opened.wait(s).unwrap();
        }
        s.waiting -= 1;
    }
}

/// The filesystem: inode numbers are the backing files' own (the root's is 1).
struct Passthrough {
    root: PathBuf,
    /// Backing path of every inode the kernel has been told of.
    paths: Mutex<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
    gate: Arc<Gate>,
}

fn errno(e: io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs as u32)
}

fn kind(m: &Metadata) -> FileType {
    let t = m.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn attr(ino: u64, m: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(m),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

impl Passthrough {
    fn new(root: &Path, gate: Arc<Gate>) -> Self {
        let paths = HashMap::from([(1, root.to_owned())]);
        Self {
            root: root.to_owned(),
            paths: Mutex::new(paths),
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            gate,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        let paths = self.paths.lock().unwrap();
        paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// The attributes of `path`, registering its inode.
    fn look(&self, path: &Path) -> Result<FileAttr, Errno> {
        let m = fs::symlink_metadata(path).map_err(errno)?;
        let ino = if path == self.root { 1 } else { m.ino() };
        self.paths.lock().unwrap().insert(ino, path.to_owned());
        Ok(attr(ino, &m))
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        let files = self.files.lock().unwrap();
        files.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn keep(&self, file: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().unwrap().insert(fh, Arc::new(file));
        FileHandle(fh)
    }

    /// Sync `file` once the gate is open, on a thread of its own, then answer; answer at once
    /// with the error if there is no file to sync.
    fn sync(&self, file: Result<Arc<File>, Errno>, data_only: bool, reply: ReplyEmpty) {
        let file = match file {
            Ok(file) => file,
            Err(e) => return reply.error(e),
        };
        let gate = self.gate.clone();
        thread::spawn(move || {
            gate.pass();
            let done = if data_only {
                file.sync_data()
            } else {
                file.sync_all()
            };
            answer(reply, done);
        });
    }

    /// Makes the entry `name` in `parent` with `make`, given its path and `mode`; returns the
    /// new entry's attributes and what `make` returned.
    fn make<T>(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        make: impl FnOnce(&Path, u32) -> io::Result<T>,
    ) -> Result<(FileAttr, T), Errno> {
        let path = self.child(parent, name)?;
        let made = make(&path, mode).map_err(errno)?;
        Ok((self.look(&path)?, made))
    }

    /// A renamed path takes its descendants' known paths with it.
    fn renamed(&self, from: &Path, to: &Path) {
        for path in self.paths.lock().unwrap().values_mut() {
            if let Ok(rest) = path.strip_prefix(from) {
                *path = to.join(rest);
            }
        }
    }
}

fn answer(reply: ReplyEmpty, done: io::Result<()>) {
    match done {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn entry(reply: ReplyEntry, looked: Result<FileAttr, Errno>) {
    match looked {
        Ok(a) => reply.entry(&NO_CACHE, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

/// The backing file opened as the kernel asked, less O_APPEND (every write comes with its
/// offset) and the creation flags the kernel has handled.
fn open_options(flags: i32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    let mut o = OpenOptions::new();
    o.read(acc != libc::O_WRONLY)
        .write(acc != libc::O_RDONLY)
        .custom_flags(flags & !(libc::O_ACCMODE | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL));
    o
}

impl Filesystem for Passthrough {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.child(parent, name).and_then(|p| self.look(&p)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).and_then(|p| self.look(&p)) {
            Ok(a) => reply.attr(&NO_CACHE, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = || -> Result<FileAttr, Errno> {
            let path = self.path(ino)?;
            if let Some(mode) = mode {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(errno)?;
            }
            if let Some(size) = size {
                let f = OpenOptions::new().write(true).open(&path).map_err(errno)?;
                f.set_len(size).map_err(errno)?;
            }
            self.look(&path)
        };
        match set() {
            Ok(a) => reply.attr(&NO_CACHE, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.make(parent, name, mode & !umask, |path, mode| {
            fs::create_dir(path)?;
            fs::set_permissions(path, fs::Permissions::from_mode(mode))
        });
        entry(reply, made.map(|(a, ())| a));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name) {
            Ok(p) => answer(reply, fs::remove_file(p)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name) {
            Ok(p) => answer(reply, fs::remove_dir(p)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let done = fs::rename(&from, &to);
        if done.is_ok() {
            self.renamed(&from, &to);
        }
        answer(reply, done);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self
            .path(ino)
            .and_then(|p| open_options(flags.0).open(p).map_err(errno));
        match opened {
            Ok(f) => reply.opened(self.keep(f), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let created = self.make(parent, name, mode & !umask, |path, mode| {
            open_options(flags).create(true).mode(mode).open(path)
        });
        match created {
            Ok((a, f)) => reply.created(
                &NO_CACHE,
                &a,
                Generation(0),
                self.keep(f),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let read = self.file(fh).and_then(|f| {
            let mut buf = vec![0; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(errno(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match read {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self
            .file(fh)
            .and_then(|f| f.write_all_at(data, offset).map_err(errno));
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(self.file(fh), datasync, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.path(ino).and_then(|p| {
            let mut all: Vec<(u64, FileType, std::ffi::OsString)> = Vec::new();
            for e in fs::read_dir(&p).map_err(errno)? {
                let e = e.map_err(errno)?;
                let m = e.metadata().map_err(errno)?;
                all.push((m.ino(), kind(&m), e.file_name()));
            }
            all.sort_by(|a, b| a.2.cmp(&b.2));
            Ok(all)
        });
        let all = match listed {
            Ok(all) => all,
            Err(e) => return reply.error(e),
        };
        let dots = [
            (ino.0, FileType::Directory, ".".into()),
            (1, FileType::Directory, "..".into()),
        ];
        for (i, (ino, kind, name)) in dots
            .into_iter()
            .chain(all)
            .enumerate()
            .skip(offset as usize)
        {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let dir = self.path(ino).and_then(|p| File::open(p).map_err(errno));
        self.sync(dir.map(Arc::new), datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.root) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = self.file(fh).and_then(|f| {
            let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
            nix::fcntl::fallocate(f.as_ref(), flags, offset as i64, length as i64)
                .map_err(|e| Errno::from_i32(e as i32))
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
