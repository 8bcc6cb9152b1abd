# ZooKeeper from Debian's package on the same base as the Dyad image, so the
# compose cluster needs no image that a registry must serve beyond BASE.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends zookeeper netcat-openbsd; \
    rm -rf /var/lib/apt/lists/*; \
    mkdir -p /var/lib/zookeeper/data; \
    printf 'tickTime=2000\ndataDir=/var/lib/zookeeper/data\nclientPort=2181\n4lw.commands.whitelist=ruok,srvr,stat\nadmin.enableServer=false\n' > /etc/zookeeper/zoo.cfg
EXPOSE 2181
CMD ["java", "-cp", "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar", "org.apache.zookeeper.server.quorum.QuorumPeerMain", "/etc/zookeeper/zoo.cfg"]
