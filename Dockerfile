# The proxy image, usable where Istio's proxyv2 is: `pilot-agent` is the entry point, so an
# injected init container runs `istio-iptables ...` and the sidecar `proxy sidecar ...`.
# No base image is pulled: scripts/image.sh makes the root filesystem from Debian packages
# (images/proxyv2/packages), adds pilot-agent, istio-iptables and Envoy, and builds this file
# with the context target/images:
#   podman --runtime runc build -f Dockerfile -t localhost/istio-rs/proxyv2 target/images
FROM scratch
ADD proxyv2/rootfs.tar /
WORKDIR /
# The proxy's user; Istio's injector sets it too (runAsUser 1337), and the init container root.
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/pilot-agent"]
