//! The datapath trace through BPF_PROG_TEST_RUN (lb-ebpf's trace.rs): the records of each kind
//! for both families and direct server return, the filters and the deadline applied in the
//! datapath, every verdict still counted once when `lb_trace` counts it, and nothing written
//! while the gate is closed.

use std::time::Duration;

use lb::trace::Record;
use lb_common::{Params, TraceFilter, counter, trace_kind};
use lb_tests::{
    fixture::{Collect, XDP_DROP, XDP_REDIRECT, everything, run_once, verdict_name},
    packet::{Packet, TCP_ACK, TCP_PSH, TCP_SYN},
    require_root,
    testnet::TestNet,
};

const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }]

[[service]]
name = "dsr"
vip = "10.100.0.2:80"
forwarding = "ipip"
backends = [{ address = "10.0.2.3:80" }]

[[service]]
name = "drained"
vip = "10.100.0.3:80"
backends = [{ address = "10.0.2.4:8080", weight = 0 }]
"#;

#[test]
fn records_filters_counting_and_the_deadline() {
    require_root();
    let mut net = TestNet::new("", SERVICES).unwrap();
    let collect = Collect::default();
    let (mut maps, mut logger) = net.dp.take_trace(collect.clone()).unwrap();
    let mut records = || -> Vec<Record> {
        logger.flush();
        collect.take()
    };
    let ns = net.ns.clone();
    let run = |net: &TestNet, frame: &[u8], want: u32| {
        let r = ns
            .enter(|| run_once(net.dp.program(), frame, net.vc))
            .unwrap();
        assert_eq!(verdict_name(r.verdict), verdict_name(want));
    };
    let syn = |client: &str, vip: &str| Packet::tcp(client, vip, TCP_SYN).build();

    // Off: nothing is written.
    assert!(!maps.is_on().unwrap());
    run(&net, &syn("10.0.1.2:40000", "10.100.0.1:80"), XDP_REDIRECT);
    assert!(records().is_empty());

    maps.start(&everything()).unwrap();
    let before = net.dp.stats().unwrap();
    // A new flow of each family, a DSR one, a drop of no service, one of no backend.
    run(&net, &syn("10.0.1.2:40001", "10.100.0.1:80"), XDP_REDIRECT);
    run(
        &net,
        &syn("[2001:db8:1::2]:40001", "[2001:db8:100::1]:80"),
        XDP_REDIRECT,
    );
    run(&net, &syn("10.0.1.2:40002", "10.100.0.2:80"), XDP_REDIRECT);
    run(&net, &syn("10.0.1.2:40003", "10.100.0.1:81"), XDP_DROP);
    run(&net, &syn("10.0.1.2:40004", "10.100.0.3:80"), XDP_DROP);
    // An established flow's packet: not traced.
    let data = Packet::tcp("10.0.1.2:40001", "10.100.0.1:80", TCP_ACK | TCP_PSH)
        .payload(b"x")
        .build();
    run(&net, &data, XDP_REDIRECT);
    // Mid-stream, without an entry: re-created.
    run(
        &net,
        &Packet::tcp("10.0.1.2:40005", "10.100.0.1:80", TCP_ACK).build(),
        XDP_REDIRECT,
    );
    let after = net.dp.stats().unwrap();
    // Every verdict counted once, the handed-over ones by lb_trace.
    let moved = |c| after.counter(c) - before.counter(c);
    assert_eq!(moved(counter::FWD_REDIRECT), 5);
    assert_eq!(moved(counter::DROP_NO_SERVICE), 1);
    assert_eq!(moved(counter::DROP_NO_BACKEND), 1);

    let r = records();
    assert_eq!(r.len(), 6, "{r:#?}");
    let (v4, v6, dsr, no_service, no_backend, mid) = (r[0], r[1], r[2], r[3], r[4], r[5]);
    assert_eq!(v4.kind, trace_kind::NEW_FLOW);
    assert_eq!(v4.reason, counter::FWD_REDIRECT);
    assert_eq!(v4.client, Some("10.0.1.2".parse().unwrap()));
    assert_eq!((v4.client_port, v4.vip_port), (40001, 80));
    assert!(v4.service.is_some() && v4.backend.is_some());
    assert!(v4.snat_port >= 1024, "{v4:?}");
    assert_eq!(v6.client, Some("2001:db8:1::2".parse().unwrap()));
    assert_eq!(v6.vip, Some("2001:db8:100::1".parse().unwrap()));
    assert!(v6.backend.is_some() && v6.snat_port >= 1024, "{v6:?}");
    assert_eq!((dsr.kind, dsr.snat_port), (trace_kind::NEW_FLOW, 0));
    assert!(dsr.backend.is_some());
    assert_eq!(no_service.kind, trace_kind::DROPPED);
    assert_eq!(no_service.reason, counter::DROP_NO_SERVICE);
    assert_eq!((no_service.service, no_service.vip_port), (None, 81));
    assert_eq!(no_backend.reason, counter::DROP_NO_BACKEND);
    assert!(no_backend.service.is_some());
    assert_eq!(mid.kind, trace_kind::MIDSTREAM);

    // Filters: another service's flow and another client's are not written.
    let web = v4.service.unwrap();
    maps.start(&TraceFilter {
        service_id: web,
        ..everything()
    })
    .unwrap();
    run(&net, &syn("10.0.1.2:40010", "10.100.0.2:80"), XDP_REDIRECT);
    run(&net, &syn("10.0.1.2:40011", "10.100.0.1:80"), XDP_REDIRECT);
    let r = records();
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].client_port, 40011);
    maps.start(&TraceFilter {
        client: lb_common::mapped(u32::from_ne_bytes([10, 0, 1, 0])),
        client_prefix: 96 + 24,
        ..everything()
    })
    .unwrap();
    run(&net, &syn("10.0.1.2:40012", "10.100.0.1:80"), XDP_REDIRECT);
    run(
        &net,
        &syn("[2001:db8:1::2]:40012", "[2001:db8:100::1]:80"),
        XDP_REDIRECT,
    );
    let r = records();
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].client, Some("10.0.1.2".parse().unwrap()));

    // The rate: beyond it, counted, not written.
    maps.start(&TraceFilter {
        rate: 1,
        rate_scaled: Params::per_2_32_ns(1),
        ..everything()
    })
    .unwrap();
    let (limited_before, _) = maps.losses().unwrap();
    for port in 40020..40030 {
        run(
            &net,
            &syn(&format!("10.0.1.2:{port}"), "10.100.0.1:80"),
            XDP_REDIRECT,
        );
    }
    let (limited, lost) = maps.losses().unwrap();
    assert!(records().len() <= 2);
    assert!(limited - limited_before >= 8, "{limited}");
    assert_eq!(lost, 0);

    // Past its deadline, lb_trace closes the gate itself.
    maps.start(&TraceFilter {
        until_ns: 1,
        ..everything()
    })
    .unwrap();
    assert!(maps.is_on().unwrap());
    run(&net, &syn("10.0.1.2:40040", "10.100.0.1:80"), XDP_REDIRECT);
    assert!(!maps.is_on().unwrap());
    std::thread::sleep(Duration::from_millis(10));
    assert!(records().is_empty());
    maps.stop().unwrap();
}

/// A SYN a direct-server-return service forwards in flood mode (issue 39) is traced as such,
/// with the backend it went to, which no table entry holds.
#[test]
fn a_syn_in_flood_mode_is_traced_with_its_backend() {
    require_root();
    let mut net = TestNet::new("dsr_flood_rate = 1", SERVICES).unwrap();
    let collect = Collect::default();
    let (mut maps, mut logger) = net.dp.take_trace(collect.clone()).unwrap();
    maps.start(&everything()).unwrap();
    let ns = net.ns.clone();
    let r = ns.enter(|| {
        // The rate is per CPU.
        lb_tests::fixture::on_cpu0();
        for port in [40001, 40002] {
            let syn = Packet::tcp(&format!("10.0.1.2:{port}"), "10.100.0.2:80", TCP_SYN).build();
            let r = run_once(net.dp.program(), &syn, net.vc).unwrap();
            assert_eq!(verdict_name(r.verdict), verdict_name(XDP_REDIRECT));
        }
        logger.flush();
        collect.take()
    });
    assert_eq!(r.len(), 2, "{r:#?}");
    assert_eq!(r[0].kind, trace_kind::NEW_FLOW);
    assert_eq!(r[1].kind, trace_kind::FLOOD, "{:?}", r[1]);
    assert_eq!(r[1].reason, counter::FWD_REDIRECT);
    assert_eq!(r[1].client_port, 40002);
    assert_eq!((r[1].backend, r[1].snat_port), (r[0].backend, 0));
    assert!(r[1].backend.is_some());
}
