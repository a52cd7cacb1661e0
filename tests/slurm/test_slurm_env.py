"""Slurm as a launcher kind, from its variables alone (no daemons): host lists, the task, the TCP world's
rendezvous point, the transport and thread rules."""

from __future__ import annotations

import pytest

from npddp.comm.transports import rendezvous
from npddp.comm.transports.base import resolve_transport
from npddp.util import cores, env

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
    assert env.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, says", [("a[1-", "unbalanced"), ("a]", "unbalanced"), ("a[3-1]", "'3-1'"),
                                        ("a[x]", "'x'"), ("", "names no host"), (" , ", "names no host")])
def test_a_malformed_host_list_is_one_error_naming_it(text, says):
    with pytest.raises(ValueError, match="host list") as info:
        env.expand_hostlist(text)
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
    launch = rendezvous.env_from_slurm(env.slurm_task(SPREAD), {**SPREAD, "NPDDP_JOB_SECRET": "s" * 32})
    assert (launch.rank, launch.world_size, launch.master_addr, launch.local_rank) == (5, 8, "node01", 1)
    given = {**SPREAD, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "23456"}
    launch = rendezvous.env_from_slurm(env.slurm_task(given), given)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.9", 23456)
    with pytest.raises(ValueError, match="MASTER_PORT='0' is out of range; valid: 1..65535"):
        rendezvous.env_from_slurm(env.slurm_task(SPREAD), {**SPREAD, "MASTER_PORT": "0"})


def test_without_a_secret_a_world_across_nodes_is_refused_with_one_line_naming_the_variable():
    launch = rendezvous.env_from_slurm(env.slurm_task(SPREAD), SPREAD)
    with pytest.raises(rendezvous.RendezvousError) as info:
        rendezvous.connect(launch, timeout=5)
    message = str(info.value)
    assert "\n" not in message and "NPDDP_JOB_SECRET" in message and "srun" in message


def test_cpus_per_task_are_each_tasks_threads_unless_a_thread_variable_says_otherwise():
    assert cores.auto_threads({**TASK, "SLURM_CPUS_PER_TASK": "3"}) == (3, "auto: SLURM_CPUS_PER_TASK=3")
    assert cores.auto_threads({**TASK, "SLURM_CPUS_PER_TASK": "3", "OMP_NUM_THREADS": "1"})[0] == 1
    assert cores.auto_threads(TASK, cpus=8) == (4, "auto: 8 CPUs / 2 ranks on this node")
