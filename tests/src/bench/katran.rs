//! Katran beside lb (`lb-bench --katran DIR`): Katran's XDP balancer built from a checkout of
//! its sources with its own compiler flags, loaded, configured for one VIP as Katran's tester
//! provisions one (`katran/lib/testing/utils/KatranTestProvision.cpp`, `KatranLb`), and attached
//! to an idle veth, so that lb-bench times it in the same loop as lb's program.
//!
//! Nothing of Katran is kept in this repository: its sources are read from DIR, the object is
//! written to `target/bench/katran/`, and the map layouts below are the C structs' byte layouts
//! (`katran/lib/bpf/balancer_structs.h`), which the loader checks against the object's BTF sizes.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use aya::{
    Ebpf, Pod,
    maps::{Array, ArrayOfMaps, HashMap, Map, MapData},
    programs::{Xdp, XdpMode},
};

use crate::{bench::bpf, netns::Netns};

/// The balancer's source, relative to a Katran checkout.
pub const SOURCE: &str = "katran/lib/bpf/balancer.bpf.c";
const PROGRAM: &str = "balancer_ingress";

/// Katran's consistent-hashing ring size (`RING_SIZE`, `kLbDefaultChRingSize`).
const RING_SIZE: u32 = 65537;
/// `BPF_MAP_TYPE_LRU_HASH`.
const LRU_HASH: u32 = 9;
/// The tester's default router MAC (`kDefaultMac`), written to `ctl_array[0]`.
const DEFAULT_MAC: [u8; 6] = [0x00, 0x00, 0xDE, 0xAD, 0xBE, 0xAF];
/// Real weight of the tester's reals (`kDefaultWeight`).
const WEIGHT: u32 = 1;
const PROTO_TCP: u8 = 6;

/// The compiler flags of Katran's own build (`katran/lib/Makefile-bpf`, run by
/// `build_bpf_modules_opensource.sh` without extra defines): clang to LLVM bitcode, then llc for
/// the BPF target. The include order is the Makefile's: its `include/` (a copy of
/// `katran/lib/linux_includes`), then the source root.
const CFLAGS: &[&str] = &[
    "-DDEBUG",
    "-D__KERNEL__",
    "-Wno-unused-value",
    "-Wno-pointer-sign",
    "-Wno-compare-distinct-pointer-types",
    "-O2",
    "-emit-llvm",
    "-c",
    "-g",
];
const LLCFLAGS: &[&str] = &["-march=bpf", "-filetype=obj"];

/// Builds Katran's balancer from the checkout `src` into `out` (created); returns the object.
pub fn build(src: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let c = src.join(SOURCE);
    if !c.is_file() {
        bail!(
            "{} not found: --katran wants the root of a Katran source checkout \
             (https://github.com/facebookincubator/katran)",
            c.display()
        );
    }
    for tool in ["clang", "llc"] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!(
                "{tool} not found: `cargo xtask bench --katran DIR` installs it \
                 (Debian packages clang and llvm)"
            );
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let bitcode = out.join("balancer.bpf.bc");
    let object = out.join("balancer.bpf.o");
    let mut clang = Command::new("clang");
    clang
        .arg("-I")
        .arg(src.join("katran/lib/linux_includes"))
        .arg("-I")
        .arg(src)
        .args(CFLAGS)
        .arg(&c)
        .arg("-o")
        .arg(&bitcode);
    run(&mut clang)?;
    let mut llc = Command::new("llc");
    llc.args(LLCFLAGS).arg("-o").arg(&object).arg(&bitcode);
    run(&mut llc)?;
    Ok(object)
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {line}"))?;
    if !out.status.success() {
        bail!(
            "building Katran failed: {line}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The command lines of [`build`], for the report.
pub fn build_flags() -> String {
    format!(
        "clang -I DIR/katran/lib/linux_includes -I DIR {} DIR/{SOURCE} | llc {}",
        CFLAGS.join(" "),
        LLCFLAGS.join(" ")
    )
}

/// `struct vip_definition`: address (IPv4 in the first word), port, protocol; 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct VipDefinition {
    addr: [u32; 4],
    port: u16,
    proto: u8,
    _pad: u8,
}

/// `struct vip_meta`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct VipMeta {
    flags: u32,
    vip_num: u32,
}

/// `struct real_definition`: address, flags (0: IPv4); 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RealDefinition {
    addr: [u32; 4],
    flags: u8,
    _pad: [u8; 3],
}

/// `struct ctl_value`: a union of a u64, an ifindex and a MAC.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CtlValue {
    bytes: [u8; 8],
}

/// `struct flow_key`, the key of Katran's connection table (its LRU): source, destination,
/// ports (network order), protocol; 40 bytes. The program builds it zeroed, so the padding is 0.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct FlowKey {
    src: [u32; 4],
    dst: [u32; 4],
    ports: [u16; 2],
    proto: u8,
    _pad: [u8; 3],
}

/// `struct real_pos_lru`: the real's index and (UDP only) the last access time.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct RealPosLru {
    pos: u32,
    _pad: u32,
    atime: u64,
}

// SAFETY: plain C structs of integers, every bit pattern valid, no implicit padding (explicit
// `_pad` fields instead).
unsafe impl Pod for VipDefinition {}
unsafe impl Pod for VipMeta {}
unsafe impl Pod for RealDefinition {}
unsafe impl Pod for CtlValue {}
unsafe impl Pod for FlowKey {}
unsafe impl Pod for RealPosLru {}

fn ne(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

impl FlowKey {
    /// The key Katran stores for a TCP flow `client → vip` to a VIP with its port (the
    /// destination port kept: the VIP matched with it).
    pub fn tcp(client: Ipv4Addr, cport: u16, vip: Ipv4Addr, vport: u16) -> Self {
        Self {
            src: [ne(client), 0, 0, 0],
            dst: [ne(vip), 0, 0, 0],
            ports: [cport.to_be(), vport.to_be()],
            proto: PROTO_TCP,
            _pad: [0; 3],
        }
    }
}

/// Katran loaded, configured and attached.
pub struct Katran {
    ebpf: Ebpf,
    /// The connection tables, one per CPU (`lru_mapping[cpu]`).
    lrus: Vec<Map>,
}

impl Katran {
    /// Loads `object`, provisions one TCP VIP `vip:port` with `reals` (IPv4, weight 1 each) as
    /// Katran's tester does, gives every CPU a connection table of `lru_size` entries, and
    /// attaches the balancer (native XDP) to `ifname` in `ns`.
    pub fn load(
        object: &Path,
        vip: Ipv4Addr,
        port: u16,
        reals: &[Ipv4Addr],
        lru_size: u32,
        ns: &Netns,
        ifname: &str,
    ) -> anyhow::Result<Self> {
        let mut ebpf = Ebpf::load_file(object)
            .with_context(|| format!("loading Katran's object {}", object.display()))?;
        let lrus = configure(&mut ebpf, vip, port, reals, lru_size)?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .with_context(|| format!("{PROGRAM} missing from Katran's object"))?
            .try_into()?;
        prog.load().context("verifying Katran's balancer")?;
        let ifname = std::ffi::CString::new(ifname)?;
        ns.enter(|| prog.attach(ifname.as_c_str(), XdpMode::Driver))
            .context("attaching Katran (native XDP)")?;
        Ok(Self { ebpf, lrus })
    }

    pub fn program(&self) -> &Xdp {
        self.ebpf
            .program(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .expect("checked in load()")
    }

    /// Removes a flow from every CPU's connection table (the thread may have run the flow on
    /// either), so that its next SYN creates it anew.
    pub fn forget(&mut self, key: &FlowKey) -> anyhow::Result<()> {
        for lru in &mut self.lrus {
            let mut map: HashMap<_, FlowKey, RealPosLru> = HashMap::try_from(&mut *lru)?;
            match map.remove(key) {
                Ok(()) => {}
                // Not on this CPU's table.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e).context("removing a flow from Katran's LRU"),
            }
        }
        Ok(())
    }

    /// Copies a flow's entry, made by the program on one CPU, into every CPU's connection
    /// table, so that its packets find it wherever the benchmark thread runs.
    pub fn spread(&mut self, key: &FlowKey) -> anyhow::Result<()> {
        let mut found = None;
        for lru in &self.lrus {
            let map: HashMap<_, FlowKey, RealPosLru> = HashMap::try_from(lru)?;
            if let Ok(v) = map.get(key, 0) {
                found = Some(v);
            }
        }
        let Some(v) = found else {
            bail!("Katran kept no connection-table entry for {key:?}");
        };
        for lru in &mut self.lrus {
            let mut map: HashMap<_, FlowKey, RealPosLru> = HashMap::try_from(&mut *lru)?;
            map.insert(key, &v, 0)?;
        }
        Ok(())
    }

    /// Entries in all connection tables together.
    pub fn flows(&self) -> anyhow::Result<usize> {
        let mut n = 0;
        for lru in &self.lrus {
            let map: HashMap<_, FlowKey, RealPosLru> = HashMap::try_from(lru)?;
            n += map.keys().count();
        }
        Ok(n)
    }
}

/// Writes the maps as `katran_tester` provisions a VIP through `KatranLb`: `ctl_array[0]` the
/// default MAC (`loadBpfProgs`), `vip_map` the VIP with `vip_num` 0 and no flags (`addVip`),
/// `reals[1..]` the reals (indexes from 1: 0 is never a real), `ch_rings[0..RING_SIZE]` the
/// VIP's Maglev ring over them (`addRealForVip`, `programHashRing`). The connection tables are
/// `KatranLb::initLrus`' production path (one LRU per forwarding core, here every CPU, put in
/// `lru_mapping`): the tester names no forwarding cores and so runs on the 1,000-entry
/// `fallback_cache`, which no cold-table case could measure.
fn configure(
    ebpf: &mut Ebpf,
    vip: Ipv4Addr,
    port: u16,
    reals: &[Ipv4Addr],
    lru_size: u32,
) -> anyhow::Result<Vec<Map>> {
    fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut Map> {
        ebpf.map_mut(name)
            .with_context(|| format!("map {name} missing from Katran's object"))
    }
    let mut ctl: Array<_, CtlValue> = Array::try_from(map(ebpf, "ctl_array")?)?;
    let mut mac = CtlValue::default();
    mac.bytes[..6].copy_from_slice(&DEFAULT_MAC);
    ctl.set(0, &mac, 0).context("ctl_array")?;

    let mut vips: HashMap<_, VipDefinition, VipMeta> = HashMap::try_from(map(ebpf, "vip_map")?)?;
    let key = VipDefinition {
        addr: [ne(vip), 0, 0, 0],
        port: port.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    };
    vips.insert(&key, &VipMeta::default(), 0)
        .context("vip_map")?;

    let mut real_map: Array<_, RealDefinition> = Array::try_from(map(ebpf, "reals")?)?;
    for (i, r) in reals.iter().enumerate() {
        let def = RealDefinition {
            addr: [ne(*r), 0, 0, 0],
            ..Default::default()
        };
        real_map.set(i as u32 + 1, &def, 0).context("reals")?;
    }

    // Katran's Maglev (`MaglevHash::generateHashRing`: each real's offset and skip from a hash
    // of it, weights as turns) is the algorithm lb's `populate` implements; the hash of a real
    // differs (Katran hashes its folly address), so which slot holds which real does too, not
    // the ring's shape or its cost.
    let keys: Vec<String> = reals.iter().map(Ipv4Addr::to_string).collect();
    let members: Vec<lb::maglev::Member> = keys
        .iter()
        .map(|k| lb::maglev::Member {
            key: k.as_bytes(),
            weight: WEIGHT,
        })
        .collect();
    let ring = lb::maglev::populate(&members, RING_SIZE);
    let mut rings: Array<_, u32> = Array::try_from(map(ebpf, "ch_rings")?)?;
    for (slot, member) in ring.iter().enumerate() {
        // vip_num 0: its ring starts at 0.
        rings
            .set(slot as u32, &(member + 1), 0)
            .context("ch_rings")?;
    }

    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let mut lrus = Vec::new();
    let mut mapping: ArrayOfMaps<_, MapData> = ArrayOfMaps::try_from(map(ebpf, "lru_mapping")?)?;
    for cpu in cpus {
        let fd = bpf::create_map(
            LRU_HASH,
            size_of::<FlowKey>() as u32,
            size_of::<RealPosLru>() as u32,
            lru_size,
        )
        .context("creating Katran's per-CPU LRU")?;
        let data = MapData::from_fd(fd)?;
        mapping
            .set(cpu, &data, 0)
            .with_context(|| format!("lru_mapping[{cpu}]"))?;
        lrus.push(Map::LruHashMap(data));
    }
    Ok(lrus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_the_c_structs() {
        assert_eq!(size_of::<VipDefinition>(), 20);
        assert_eq!(size_of::<RealDefinition>(), 20);
        assert_eq!(size_of::<FlowKey>(), 40);
        assert_eq!(size_of::<RealPosLru>(), 16);
        assert_eq!(size_of::<CtlValue>(), 8);
    }
}
