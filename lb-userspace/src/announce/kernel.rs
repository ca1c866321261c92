//! The kernel's routing table as [`RouteTable`]: blackhole host routes of lb's protocol in the
//! configured table, written over rtnetlink. Blackhole, because nothing forwards by that
//! table (no rule points at it): it is only where BIRD's kernel protocol learns what to
//! announce, and BIRD's BGP export sets the next hop (`next hop self`).

use std::{
    collections::BTreeSet,
    io,
    net::IpAddr,
    os::fd::{AsFd as _, OwnedFd},
    time::Duration,
};

use super::{ROUTE_PROTOCOL, RouteTable};
use crate::rtnl::{self, Route};

/// Longest wait for the kernel's answer to one request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Table `table` of this network namespace, through a route netlink socket of its own.
pub struct KernelTable {
    fd: OwnedFd,
    table: u32,
}

impl KernelTable {
    /// Opens a route netlink socket in the calling thread's network namespace.
    pub fn open(table: u32) -> io::Result<Self> {
        let fd = rtnl::open(0, false)?;
        rtnl::set_receive_timeout(fd.as_fd(), ANSWER_TIMEOUT)?;
        // Older kernels dump every route; `routes` filters them itself.
        let _ = rtnl::set_strict_dumps(fd.as_fd());
        Ok(Self { fd, table })
    }

    fn route(&self, vip: IpAddr) -> Route {
        Route::blackhole(vip, self.table, ROUTE_PROTOCOL)
    }
}

impl RouteTable for KernelTable {
    fn list(&mut self) -> io::Result<BTreeSet<IpAddr>> {
        Ok(rtnl::routes(self.fd.as_fd(), self.table, ROUTE_PROTOCOL)?
            .into_iter()
            // lb writes host routes only; anything else of its protocol is someone's mistake,
            // left alone.
            .filter(|r| r.prefix_len == if r.dst.is_ipv4() { 32 } else { 128 })
            .map(|r| r.dst)
            .collect())
    }

    fn add(&mut self, vip: IpAddr) -> io::Result<()> {
        rtnl::add_route(self.fd.as_fd(), &self.route(vip))
    }

    fn remove(&mut self, vip: IpAddr) -> io::Result<()> {
        match rtnl::delete_route(self.fd.as_fd(), &self.route(vip)) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }
}

/// Removes every route of lb's protocol from `table` (`lb stop` when no daemon runs); the
/// VIPs removed.
pub fn flush(table: u32) -> io::Result<Vec<IpAddr>> {
    let mut kernel = KernelTable::open(table)?;
    let vips = kernel.list()?;
    for vip in &vips {
        kernel.remove(*vip)?;
    }
    Ok(vips.into_iter().collect())
}
