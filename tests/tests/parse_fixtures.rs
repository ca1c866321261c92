//! Every parse path of the XDP program through BPF_PROG_TEST_RUN: verdict, output bytes and the
//! counter that must count the frame. Needs root (loads the program).

use lb::{
    config::{self, Config},
    dataplane::Dataplane,
};
use lb_common::counter::*;
use lb_tests::{
    fixture::{Fixture, XDP_DROP, XDP_PASS, run_fixtures},
    packet::{Packet, TCP_ACK, TCP_SYN},
    require_root,
};

const CONFIG: &str = r#"
[lb]
interfaces = ["unused0"]

[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
backends = [{ address = "10.0.2.2:5353" }]
"#;

fn dataplane() -> (Dataplane, Config) {
    require_root();
    let config = config::parse(CONFIG).expect("test config");
    let mut dp = Dataplane::load().expect("load XDP program");
    dp.set_services(&config.services).expect("fill service map");
    (dp, config)
}

const CLIENT: &str = "10.0.1.2:40000";
const VIP_TCP: &str = "10.100.0.1:80";
const VIP_UDP: &str = "10.100.0.1:53";
const OTHER: &str = "10.0.1.1:22";

fn truncated(mut frame: Vec<u8>, len: usize) -> Vec<u8> {
    frame.truncate(len);
    frame
}

fn with_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    frame[at] = value;
    frame
}

#[test]
fn parse_paths_have_defined_counted_verdicts() {
    let (dp, _config) = dataplane();
    let syn = Packet::tcp(CLIENT, VIP_TCP, TCP_SYN);
    let syn_frame = syn.build();
    let udp = Packet::udp(CLIENT, VIP_UDP).payload(b"query");
    let fixtures = vec![
        // Service hits (forwarding comes with the datapath issue: passed for now).
        Fixture::new("TCP SYN to the VIP", syn_frame.clone(), XDP_PASS, VIP_HIT),
        Fixture::new(
            "TCP ACK with data to the VIP",
            Packet::tcp(CLIENT, VIP_TCP, TCP_ACK)
                .payload(&[7; 100])
                .build(),
            XDP_PASS,
            VIP_HIT,
        ),
        Fixture::new("UDP to the VIP", udp.build(), XDP_PASS, VIP_HIT),
        Fixture::new(
            "UDP with checksum 0 to the VIP",
            udp.clone().udp_zero_checksum().build(),
            XDP_PASS,
            VIP_HIT,
        ),
        Fixture::new(
            "802.1Q-tagged SYN to the VIP",
            syn.clone().vlan(10).build(),
            XDP_PASS,
            VIP_HIT,
        )
        .also(VLAN),
        Fixture::new(
            "SYN to the VIP with IP options (IHL 6)",
            syn.clone().ip_options(&[1, 1, 1, 1]).build(),
            XDP_PASS,
            VIP_HIT,
        )
        .also(IP_OPTIONS),
        Fixture::new(
            "SYN to the VIP with 40 bytes of IP options (IHL 15)",
            syn.clone().ip_options(&[1; 40]).build(),
            XDP_PASS,
            VIP_HIT,
        )
        .also(IP_OPTIONS),
        Fixture::new(
            "tagged, with options",
            syn.clone().vlan(4095).ip_options(&[1, 1, 1, 1]).build(),
            XDP_PASS,
            VIP_HIT,
        )
        .also(VLAN)
        .also(IP_OPTIONS),
        Fixture::new(
            "Ethernet padding after a short datagram",
            {
                let mut f = syn_frame.clone();
                f.extend_from_slice(&[0; 6]);
                f
            },
            XDP_PASS,
            VIP_HIT,
        ),
        // Not for a service: passed untouched.
        Fixture::new(
            "TCP to another address",
            Packet::tcp(CLIENT, OTHER, TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "TCP to the VIP address, other port",
            Packet::tcp(CLIENT, "10.100.0.1:443", TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "UDP to the TCP service's port",
            Packet::udp(CLIENT, VIP_TCP).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "TCP to the UDP service's port",
            Packet::tcp(CLIENT, VIP_UDP, TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "ICMP to the VIP address",
            Packet::ip_proto(CLIENT, VIP_TCP, 1)
                .payload(&[8, 0, 0, 0, 0, 1, 0, 1])
                .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "tagged TCP to another address",
            Packet::tcp(CLIENT, OTHER, TCP_SYN).vlan(3).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .also(VLAN),
        // Not IPv4.
        Fixture::new(
            "ARP",
            syn.clone().ether_type(0x0806).build(),
            XDP_PASS,
            PASS_NOT_IPV4,
        ),
        Fixture::new(
            "IPv6 EtherType",
            syn.clone().ether_type(0x86dd).build(),
            XDP_PASS,
            PASS_NOT_IPV4,
        ),
        Fixture::new(
            "two stacked 802.1Q tags",
            syn.clone().vlan(5).ether_type(0x8100).build(),
            XDP_PASS,
            PASS_NOT_IPV4,
        )
        .also(VLAN),
        // Fragments.
        Fixture::new(
            "first fragment to the VIP",
            syn.clone().fragment(true, 0).build(),
            XDP_DROP,
            DROP_FRAGMENT,
        ),
        Fixture::new(
            "later fragment to the VIP",
            syn.clone().fragment(false, 100).build(),
            XDP_DROP,
            DROP_FRAGMENT,
        ),
        Fixture::new(
            "fragment to another address",
            Packet::udp(CLIENT, OTHER).fragment(true, 0).build(),
            XDP_PASS,
            PASS_FRAGMENT,
        ),
        // Malformed: dropped when for a VIP address, passed otherwise.
        // (Frames shorter than 14 bytes never reach XDP: the kernel, and BPF_PROG_TEST_RUN,
        // refuse them.)
        Fixture::new(
            "Ethernet header only",
            truncated(syn_frame.clone(), 14),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "VLAN tag cut",
            truncated(syn.clone().vlan(1).build(), 16),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "IPv4 header cut at 19 bytes",
            truncated(syn_frame.clone(), 33),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "IPv4 version 6 in an IPv4 EtherType",
            with_byte(syn_frame.clone(), 14, 0x65),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "IHL 4",
            with_byte(syn_frame.clone(), 14, 0x44),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "IHL beyond the datagram",
            with_byte(syn_frame.clone(), 14, 0x4f),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "total length beyond the frame",
            with_byte(syn_frame.clone(), 16, 0x05),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP header cut",
            truncated(syn_frame.clone(), 14 + 20 + 10),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP data offset 4",
            with_byte(syn_frame.clone(), 14 + 20 + 12, 0x40),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP data offset beyond the datagram",
            with_byte(syn_frame.clone(), 14 + 20 + 12, 0xf0),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP header cut",
            truncated(udp.build(), 14 + 20 + 4),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP length 7",
            with_byte(udp.build(), 14 + 20 + 5, 7),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP length beyond the datagram",
            with_byte(udp.build(), 14 + 20 + 5, 200),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "cut TCP to another address",
            truncated(Packet::tcp(CLIENT, OTHER, TCP_SYN).build(), 40),
            XDP_PASS,
            PASS_MALFORMED,
        ),
    ];
    run_fixtures(&dp, &fixtures);
}

#[test]
fn service_counters_count_packets_and_bytes() {
    let (dp, _config) = dataplane();
    let frame = Packet::udp(CLIENT, VIP_UDP).payload(&[1; 58]).build();
    for _ in 0..3 {
        lb_tests::fixture::run_once(dp.program(), &frame).unwrap();
    }
    lb_tests::fixture::run_once(dp.program(), &Packet::tcp(CLIENT, OTHER, TCP_SYN).build())
        .unwrap();
    let stats = dp.stats().unwrap();
    assert_eq!(stats.services[1].packets, 3, "dns service");
    assert_eq!(stats.services[1].bytes, 3 * frame.len() as u64);
    assert_eq!(stats.services[0].packets, 0, "web service untouched");
}

#[test]
fn removed_services_stop_matching() {
    let (mut dp, config) = dataplane();
    let frame = Packet::tcp(CLIENT, VIP_TCP, TCP_SYN).build();
    let hit = |dp: &Dataplane| {
        let before = dp.stats().unwrap().counter(VIP_HIT);
        lb_tests::fixture::run_once(dp.program(), &frame).unwrap();
        dp.stats().unwrap().counter(VIP_HIT) - before
    };
    assert_eq!(hit(&dp), 1);
    dp.set_services(&config.services[1..]).unwrap();
    assert_eq!(
        hit(&dp),
        0,
        "web removed: its VIP port is no longer a service"
    );
}
