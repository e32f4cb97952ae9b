//! What an ELF binary needs from the system at run time, read from the file itself: the
//! shared libraries it names (DT_NEEDED in `.dynamic`) and the symbol versions it needs from
//! them (`.gnu.version_r`, what `objdump -p` prints as "Version References"). The dynamic
//! loader refuses to start a binary whose needed version a library lacks, so these are its
//! floor. Only 64-bit little-endian files (x86_64), which is what leasewrap is shipped as.

use std::path::Path;

const SHT_DYNAMIC: u32 = 6;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
const DT_NEEDED: u64 = 1;

/// What a binary needs: each library by name, and each (library, version) pair.
#[derive(Debug, Default)]
pub struct Needs {
    pub libraries: Vec<String>,
    pub versions: Vec<(String, String)>,
}

/// One section header: type, file offset, size, linked section, info.
struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    info: usize,
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u16(&self, at: usize) -> usize {
        u16::from_le_bytes(self.0[at..at + 2].try_into().unwrap()).into()
    }

    fn u32(&self, at: usize) -> usize {
        u32::from_le_bytes(self.0[at..at + 4].try_into().unwrap()) as usize
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().unwrap())
    }

    /// The NUL-terminated string at `at`.
    fn string(&self, at: usize) -> String {
        let end = self.0[at..].iter().position(|b| *b == 0).unwrap();
        String::from_utf8_lossy(&self.0[at..at + end]).into_owned()
    }

    fn sections(&self) -> Vec<Section> {
        let (start, size, count) = (self.u64(0x28) as usize, self.u16(0x3a), self.u16(0x3c));
        (0..count)
            .map(|i| start + i * size)
            .map(|h| Section {
                kind: self.u32(h + 4) as u32,
                offset: self.u64(h + 24) as usize,
                size: self.u64(h + 32) as usize,
                link: self.u32(h + 40),
                info: self.u32(h + 44),
            })
            .collect()
    }
}

/// The needs of the ELF file at `path`; panics on anything but a 64-bit little-endian ELF.
pub fn needs(path: &Path) -> Needs {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        data.starts_with(b"\x7fELF\x02\x01"),
        "{}: not a 64-bit little-endian ELF file",
        path.display()
    );
    let elf = Bytes(&data);
    let sections = elf.sections();
    let mut needs = Needs::default();
    for s in &sections {
        let strings = sections[s.link].offset;
        match s.kind {
            SHT_DYNAMIC => needs.libraries.extend(libraries(&elf, s, strings)),
            SHT_GNU_VERNEED => needs.versions.extend(versions(&elf, s, strings)),
            _ => {}
        }
    }
    needs
}

/// DT_NEEDED of a `.dynamic` section: 16-byte (tag, value) entries, the value a string offset.
fn libraries(elf: &Bytes, s: &Section, strings: usize) -> Vec<String> {
    let entries = (s.offset..s.offset + s.size).step_by(16);
    entries
        .filter(|at| elf.u64(*at) == DT_NEEDED)
        .map(|at| elf.string(strings + elf.u64(at + 8) as usize))
        .collect()
}

/// The Verneed chain (one entry per library, `info` of them) and each one's Vernaux chain
/// (one per version needed from it).
fn versions(elf: &Bytes, s: &Section, strings: usize) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut need = s.offset;
    for _ in 0..s.info {
        let (count, file, mut aux) = (elf.u16(need + 2), elf.u32(need + 4), elf.u32(need + 8));
        let library = elf.string(strings + file);
        let mut at = need + aux;
        for _ in 0..count {
            found.push((library.clone(), elf.string(strings + elf.u32(at + 8))));
            aux = elf.u32(at + 12);
            at += aux;
        }
        need += elf.u32(need + 12);
    }
    found
}

/// `(2, 17)` of `GLIBC_2.17`; None for another name (`GLIBC_PRIVATE`, `GCC_3.0`, ...).
pub fn glibc_version(version: &str) -> Option<(u32, u32)> {
    let (major, minor) = version.strip_prefix("GLIBC_")?.split_once('.')?;
    // `GLIBC_2.2.5`: the third number does not matter against a floor of two.
    let minor = minor.split('.').next()?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}
