"""Slurm as a launcher kind, from its variables alone (no daemons): host lists, the task, the TCP world's
rendezvous point, the transport and thread rules."""

from __future__ import annotations

import pytest

from npddp.comm.transports import launch_env, rendezvous
from npddp.comm.transports.base import resolve_transport
from npddp.util import env, hostlist, threads

#: What srun (no MPI plugin) gave task 1 of a 2-task step on one node, as seen on a real slurmd.
TASK = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "vm",
        "SLURM_JOB_NODELIST": "vm", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2"}
#: A batch script's own environment: an allocation, not a task of a step.
BATCH = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
         "SLURM_JOB_NODELIST": "vm", "SLURM_NODEID": "0"}
#: Task 5 of 8 on four nodes: the third node of node[01-03,07], holding tasks 4 and 5.
SPREAD = {**TASK, "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
          "SLURM_STEP_NODELIST": "node[01-03,07]", "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x4)"}


@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]), ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a[8-11],login1", ["a8", "a9", "a10", "a11", "login1"]), ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("gpu[003-004]-ib,c1", ["gpu003-ib", "gpu004-ib", "c1"])])
def test_a_compressed_host_list_expands_in_slurms_order(text, hosts):
    assert hostlist.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, says", [("a[1-", "unbalanced"), ("a]", "unbalanced"), ("a[3-1]", "'3-1'"),
                                        ("a[x]", "'x'"), ("", "names no host"), (" , ", "names no host")])
def test_a_malformed_host_list_is_one_error_naming_it(text, says):
    with pytest.raises(ValueError, match="host list") as info:
        hostlist.expand_hostlist(text)
    assert says in str(info.value) and "valid: e.g. node[01-04,07]" in str(info.value)


def test_a_task_of_an_srun_step_is_the_slurm_launcher_with_its_rank_size_and_node():
    task = env.slurm_task(TASK)
    assert (task.rank, task.size, task.local_rank, task.local_size) == (1, 2, 1, 2)
    assert env.launcher(TASK) == "slurm" and resolve_transport("auto", TASK) == "tcp"
    assert (env.world_rank(TASK), env.world_size(TASK), env.local_size(TASK)) == (1, 2, (2, "SLURM_STEP_TASKS_PER_NODE"))


@pytest.mark.parametrize("environ", [
    BATCH, {**TASK, "RANK": "0", "WORLD_SIZE": "4"},                   # a batch script; npddp.run inside the job
    {**TASK, "PMI_RANK": "0", "PMI_SIZE": "2"}, {**TASK, "PMI_RANK": "1", "PMI_SIZE": "4"},   # mpirun inside
    {**TASK, "SLURM_PROCID": "2"}, {**TASK, "SLURM_STEP_ID": "x"}])
def test_no_task_where_srun_did_not_start_this_process_as_a_rank(environ):
    assert env.slurm_task(environ) is None
    assert env.launcher(environ) in (None, "tcp", "mpi")


def test_srun_with_an_mpi_plugin_is_mpi_while_mpi4py_is_installed(monkeypatch):
    pmi2 = {**TASK, "PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "11"}
    pmix = {**TASK, "PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.7.0"}         # PMIx gives no size
    assert env.launcher(pmi2) == env.launcher(pmix) == "mpi" and resolve_transport("auto", pmi2) == "mpi"
    assert env.mpi_world_size(pmix) == env.world_size(pmix) == 2
    monkeypatch.setattr(env, "mpi4py_installed", lambda: False)
    assert env.launcher(pmi2) == "slurm" and resolve_transport("auto", pmi2) == "tcp"


def test_the_rendezvous_is_on_loopback_for_one_node_else_the_steps_first_node_at_a_port_from_the_ids():
    one, spread = env.slurm_task(TASK), env.slurm_task(SPREAD)
    assert one.master_addr == "127.0.0.1" and spread.master_addr == "node01"
    assert (spread.local_rank, spread.local_size) == (1, 2)
    assert one.master_port == env.SLURM_PORT_BASE + 7 * env.SLURM_STEP_SLOTS
    next_step = env.slurm_task({**TASK, "SLURM_STEP_ID": "1"})
    assert next_step.master_port == one.master_port + 1
    ports = {env.slurm_task({**TASK, "SLURM_JOB_ID": str(job)}).master_port for job in range(0, 10 ** 6, 997)}
    assert min(ports) >= env.SLURM_PORT_BASE and max(ports) < env.SLURM_PORT_BASE + env.SLURM_PORT_SPAN


def test_the_tcp_world_takes_slurms_rank_and_a_given_master_address_and_port():
    launch = launch_env.env_from_slurm(env.slurm_task(SPREAD), {**SPREAD, "NPDDP_JOB_SECRET": "s" * 32})
    assert (launch.rank, launch.world_size, launch.master_addr, launch.local_rank) == (5, 8, "node01", 1)
    given = {**SPREAD, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "23456"}
    launch = launch_env.env_from_slurm(env.slurm_task(given), given)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.9", 23456)
    with pytest.raises(ValueError, match="MASTER_PORT='0' is out of range; valid: 1..65535"):
        launch_env.env_from_slurm(env.slurm_task(SPREAD), {**SPREAD, "MASTER_PORT": "0"})


def test_without_a_secret_a_world_across_nodes_is_refused_with_one_line_naming_the_variable():
    launch = launch_env.env_from_slurm(env.slurm_task(SPREAD), SPREAD)
    with pytest.raises(rendezvous.RendezvousError) as info:
        rendezvous.connect(launch, timeout=5)
    message = str(info.value)
    assert "\n" not in message and "NPDDP_JOB_SECRET" in message and "srun" in message


def test_cpus_per_task_are_each_tasks_threads_unless_a_thread_variable_says_otherwise():
    assert threads.auto_threads({**TASK, "SLURM_CPUS_PER_TASK": "3"}) == (3, "auto: SLURM_CPUS_PER_TASK=3")
    assert threads.auto_threads({**TASK, "SLURM_CPUS_PER_TASK": "3", "OMP_NUM_THREADS": "1"})[0] == 1
    assert threads.auto_threads(TASK, cpus=8) == (4, "auto: 8 CPUs / 2 ranks on this node")


def test_two_slurm_jobs_on_one_port_never_merge_a_stranger_is_refused_in_one_line():
    """Jobs 1 and 1251 derive the same port (12016): before, job 1251's rank 1 joined job 1's rank 0 and both
    'succeeded'. The registration carries the job's identity: the stranger ends with one line, job 1 goes on."""
    import socket
    import threading
    job = {**TASK, "SLURM_JOB_ID": "1"}
    other = {**TASK, "SLURM_JOB_ID": "1251"}
    assert env.slurm_task(job).master_port == env.slurm_task(other).master_port == 12016
    with socket.socket() as probe:      # the derived port may be taken on this machine: the same free one for both
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = {name: launch_env.env_from_slurm(env.slurm_task(e), {**e, "MASTER_PORT": port})
             for name, e in (("a0", {**job, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}), ("a1", job), ("b1", other))}
    assert ranks["a0"].job == "slurm job 1 step 0" and ranks["b1"].job == "slurm job 1251 step 0"
    results: dict = {}

    def join(name):
        try:
            results[name] = rendezvous.connect(ranks[name], timeout=20)
        except rendezvous.RendezvousError as exc:
            results[name] = exc

    first = threading.Thread(target=join, args=("a0",))
    first.start()
    join("b1")                           # retries until job 1's rank 0 listens, then is refused
    second = threading.Thread(target=join, args=("a1",))
    second.start()
    first.join(30)
    second.join(30)
    refused = str(results["b1"])
    assert isinstance(results["b1"], rendezvous.RendezvousError) and "\n" not in refused, refused
    assert "belongs to slurm job 1 step 0, not to this rank's slurm job 1251 step 0" in refused
    assert "MASTER_PORT" in refused
    for name in ("a0", "a1"):
        socks, _ = results[name]        # job 1 formed its world of two
        assert sum(s is not None for s in socks) == 1
        for s in socks:
            if s is not None:
                s.close()


@pytest.mark.parametrize("environ, size, says", [
    (TASK, 1, "(SLURM_STEP_NUM_TASKS=2): srun gave MPI no process manager"),     # srun -n 2 --transport mpi
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, 1, "(WORLD_SIZE=2): its ranks are separate"),
    ({**TASK, "SLURM_PROCID": "2"}, 1, "SLURM_PROCID=2 with SLURM_STEP_NUM_TASKS=2 (valid: 0..1)"),
    ({**TASK, "SLURM_PROCID": "-1"}, 1, "SLURM_PROCID=-1 with SLURM_STEP_NUM_TASKS=2 (valid: 0..1)"),
    ({**TASK, "SLURM_PROCID": "-1"}, 2, "SLURM_PROCID=-1"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, 1, "(PMI_SIZE=2): this MPI does not speak"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"}, 2, "(OMPI_COMM_WORLD_SIZE=3)"),
])
def test_a_world_other_than_the_innermost_launchers_is_one_line(environ, size, says):
    """Before: a world of one under srun -n 2 or npddp.run --nproc 2 (--transport mpi), or with SLURM_PROCID out of
    range, trained alone on every rank and exited 0."""
    refusal = env.world_refusal(size, "MPI", environ)
    assert refusal is not None and says in refusal and "\n" not in refusal, refusal


@pytest.mark.parametrize("environ, size", [
    ({}, 1), (BATCH, 1), (TASK, 2), ({"RANK": "1", "WORLD_SIZE": "2"}, 2),
    ({**TASK, "PMI_RANK": "3", "PMI_SIZE": "4"}, 4),            # mpirun inside the step: its own size counts
    ({**TASK, "RANK": "0", "WORLD_SIZE": "4"}, 4),              # npddp.run inside the step
    ({**TASK, "PMIX_RANK": "1"}, 2), ({**TASK, "SLURM_STEP_ID": "x"}, 1)])
def test_the_world_every_launcher_agrees_on_passes(environ, size):
    assert env.world_refusal(size, "MPI", environ) is None
