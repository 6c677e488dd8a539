set -x
uname -a; cat /etc/os-release | head -3; nvidia-smi -L; python3 --version; df -h / /tmp | tail -2; nproc
which iptables nft iptables-legacy ip conntrack xtables-nft-multi 2>&1
ls /lib/modules 2>&1 | head; cat /proc/net/ip_tables_names 2>&1; lsmod 2>&1 | grep -i -E "nf_|ip_tables|br_netfilter|xt_" | head
mkdir -p /tmp/nf && for f in .probe/*.deb; do dpkg -x $f /tmp/nf; done
export LD_LIBRARY_PATH=/tmp/nf/usr/lib/x86_64-linux-gnu PATH=/tmp/nf/usr/sbin:$PATH
ldd /tmp/nf/usr/sbin/xtables-nft-multi | grep -i "not found"
xtables-nft-multi iptables -t nat -N KSWTEST && xtables-nft-multi iptables -t nat -A KSWTEST -d 10.96.0.1/32 -p tcp -j DNAT --to-destination 127.0.0.1:6443 && xtables-nft-multi iptables -t nat -S
xtables-legacy-multi iptables -t nat -L 2>&1 | head -5
nft add table ip kswt && nft add chain ip kswt c '{ type nat hook output priority -100; }' && nft list ruleset | head -20
cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>&1; ls /proc/sys/net/netfilter 2>&1 | head -3
ip link add kswtb type bridge && echo bridge-ok; ip link del kswtb
cat /sys/fs/cgroup/cgroup.controllers; ls /dev/nvidia*
which chromium chromium-browser google-chrome 2>&1 | head -2
