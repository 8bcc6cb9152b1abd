"""Persistent volumes and dynamic reservations in the agent: the core keeps and
checkpoints what the master sends (agent/persistent.py, AgentState), and the shell
piece makes, links and removes directories (agent/volumes.py)."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest

from agent import checkpoint, volumes
from agent.checkpoint import Recover
from agent.container_spec import DockerConfig, create_request
from agent.containers_core import LaunchContainer
from agent.model import LaunchExecutor
from agent.persistent import (
    CreateVolume,
    DestroyVolume,
    MountVolumes,
    VolumeMount,
    volume_path,
)
from dyad.containers import SANDBOX_MOUNT, ContainerInfo, DockerInfo
from dyad.messages import (
    CheckpointResources,
    LaunchTask,
    RegisterAgent,
    Rejected,
    TaskState,
)
from dyad.resources import Resources
from dyad.volumes import DynamicResources, PersistentVolume
from tests.unit.test_agent_state import (
    Agent,
    command_task,
    executor_task,
    of_type,
    running_executor,
    status,
    to_master,
)

TOTAL = "cpus:4;mem:1024;disk:1000;ports:[31000-31009]"
VOLUME = PersistentVolume(id="v1", container_path="data/db", size=64, role="eng")
WITH_VOLUME = DynamicResources(version=2, reservations=Resources.parse(
    "disk(eng):36;disk(eng){v1}:64"), volumes=[VOLUME])
ON_VOLUME = Resources.parse("cpus:1;mem:128;disk(eng){v1}:64")


def agent() -> Agent:
    a = Agent(resources=Resources.parse(TOTAL))
    a.register()
    return a


def test_the_agent_keeps_what_the_master_sends_and_makes_the_volume() -> None:
    a = agent()
    effects = a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    assert of_type(effects, CreateVolume) == [
        CreateVolume("/work/volumes/roles/eng/v1", VOLUME)]
    assert a.state.dynamic == WITH_VOLUME and a.saved.dynamic == WITH_VOLUME
    assert a.state.total == Resources.parse(
        "cpus:4;mem:1024;disk:900;disk(eng):36;disk(eng){v1}:64;ports:[31000-31009]")
    # It says so when it registers again.
    (register,) = to_master(a.register(), RegisterAgent)
    assert register.dynamic == WITH_VOLUME


def test_an_older_version_or_one_that_does_not_fit_is_refused() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    effects = a.master(CheckpointResources(agent_id="A1", resources=DynamicResources(version=1)))
    assert "older" in to_master(effects, Rejected)[0].reason
    effects = a.master(CheckpointResources(agent_id="A1", resources=DynamicResources(
        version=3, reservations=Resources.parse("disk(eng):5000"))))
    assert "do not fit" in to_master(effects, Rejected)[0].reason
    assert a.state.dynamic == WITH_VOLUME


def test_a_task_on_a_volume_gets_it_linked_before_it_starts_and_destroy_waits() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    effects = a.run(command_task("t1", ON_VOLUME))
    (mount,) = of_type(effects, MountVolumes)
    (launch,) = of_type(effects, LaunchExecutor)
    assert effects.index(mount) < effects.index(launch)
    assert mount == MountVolumes(launch.sandbox_dir, (VolumeMount(
        "/work/volumes/roles/eng/v1", "data/db", "RW"),))
    # The master would never destroy it now; if it did, the agent refuses.
    gone = DynamicResources(version=3, reservations=Resources.parse("disk(eng):100"))
    effects = a.master(CheckpointResources(agent_id="A1", resources=gone))
    assert "in use" in to_master(effects, Rejected)[0].reason
    assert not of_type(effects, DestroyVolume)


def test_a_second_task_of_a_running_executor_gets_its_volume_too() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    running_executor(a, executor_task("t1"))
    effects = a.run(executor_task("t2", resources=ON_VOLUME))
    (mount,) = of_type(effects, MountVolumes)
    sent = [e for e in effects if isinstance(getattr(e, "message", None), LaunchTask)]
    assert sent and effects.index(mount) < effects.index(sent[0])


def test_destroy_removes_the_directory_once_no_task_uses_it() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    gone = DynamicResources(version=3, reservations=Resources.parse("disk(eng):100"))
    effects = a.master(CheckpointResources(agent_id="A1", resources=gone))
    assert of_type(effects, DestroyVolume) == [
        DestroyVolume("/work/volumes/roles/eng/v1", VOLUME)]


def test_volumes_survive_an_agent_restart_through_the_checkpoint() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    a.run(command_task("t1", ON_VOLUME))
    saved = checkpoint.decode(checkpoint.encode(a.state.saved()))
    assert saved.dynamic == WITH_VOLUME
    b = Agent(resources=Resources.parse(TOTAL))
    effects = b(Recover(saved))
    assert of_type(effects, CreateVolume) == [CreateVolume(volume_path("/work", VOLUME), VOLUME)]
    assert b.state.dynamic == WITH_VOLUME
    assert b.state.total == a.state.total


def test_old_checkpoints_without_dynamic_resources_load() -> None:
    a = agent()
    raw = checkpoint.encode(attrs.evolve(a.state.saved()))
    assert checkpoint.decode(raw.replace(b',"dynamic":{"version":0,"reservations":"","volumes":[]}',
                                         b"")).dynamic == DynamicResources()


def test_roles_with_slashes_never_share_a_volume_path() -> None:
    nested = PersistentVolume(id="x", container_path="d", size=1, role="eng/ml")
    flat = PersistentVolume(id="ml", container_path="d", size=1, role="eng")
    assert volume_path("/w", nested) == "/w/volumes/roles/eng%2Fml/x"
    assert not volume_path("/w", nested).startswith(volume_path("/w", flat) + "/")


# ----------------------------------------------------------------- the shell piece


def test_create_mount_and_destroy_on_disk(tmp_path: Path) -> None:
    path = str(tmp_path / "volumes/roles/eng/v1")
    volumes.create(CreateVolume(path, VOLUME))
    volumes.create(CreateVolume(path, VOLUME))  # again: nothing changes
    sandbox = tmp_path / "sandbox"
    mount = MountVolumes(str(sandbox), (VolumeMount(path, "data/db", "RW"),))
    volumes.mount(mount)
    volumes.mount(mount)  # a second task of the same run
    (sandbox / "data/db/file").write_text("kept")
    assert Path(path, "file").read_text() == "kept"
    volumes.destroy(DestroyVolume(path, VOLUME))
    assert not os.path.exists(path)
    volumes.destroy(DestroyVolume(path, VOLUME))  # already gone: fine


def test_a_mount_never_goes_through_a_link_in_the_sandbox(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (sandbox / "data").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(volumes.VolumeError, match="is a link"):
        volumes.mount(MountVolumes(str(sandbox), (VolumeMount(str(tmp_path), "data/db", "RW"),)))
    assert not (tmp_path / "elsewhere/db").exists()


def test_a_task_state_is_unaffected_by_its_volume() -> None:
    a = agent()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    running_executor(a, command_task("t1", ON_VOLUME))
    effects = a.executor(status("t1", TaskState.TASK_FINISHED, "u1", executor_id="t1"))
    assert not of_type(effects, DestroyVolume)
    assert a.state.dynamic == WITH_VOLUME


def test_a_container_task_gets_its_volume_bound_under_the_sandbox_mount() -> None:
    a = Agent(resources=Resources.parse(TOTAL), containerizers=("process", "docker"))
    a.register()
    a.master(CheckpointResources(agent_id="A1", resources=WITH_VOLUME))
    task = attrs.evolve(command_task("db", ON_VOLUME),
                        container=ContainerInfo(docker=DockerInfo(image="busybox")))
    effects = a.run(task)
    assert not of_type(effects, MountVolumes)  # no link: the engine binds it
    (launch,) = of_type(effects, LaunchContainer)
    assert launch.run.persistent == (VolumeMount("/work/volumes/roles/eng/v1", "data/db", "RW"),)
    binds = create_request(launch.run, DockerConfig())["HostConfig"]["Binds"]  # type: ignore[index]
    assert f"/work/volumes/roles/eng/v1:{SANDBOX_MOUNT}/data/db:rw" in binds
