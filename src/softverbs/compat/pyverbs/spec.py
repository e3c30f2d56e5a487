"""``pyverbs.spec``: the header specs a steering flow matches on."""

from softverbs.verbs.flow import EthSpec, Ipv4ExtSpec, Ipv6Spec, Spec, TcpUdpSpec

__all__ = ["EthSpec", "Ipv4ExtSpec", "Ipv6Spec", "Spec", "TcpUdpSpec"]
