#!/bin/sh
# local-agent.sh HOST COMMAND: a launch agent (tmpirun --launch-agent) that runs COMMAND on
# this machine, in the agent's own process group, as `ip netns exec NS`, `nsenter` or a
# container's entry would: the tests of issue 55 item 6 (no rank outlives its job under any
# launch agent) start "remote" ranks with it. HOST is ignored.
shift
exec sh -c "$1"
