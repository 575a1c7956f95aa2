"""CloudFormation stack wait: botocore's own waiters on the async client (aiobotocore)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.amazon.aws.exceptions import WaiterMaxAttemptsError, WaiterTerminalFailure
from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger
from airflow.triggers.base import TriggerEvent

from ultracluster.hooks.network_stack import NetworkStackHook
from ultracluster.run.events import event
from ultracluster.run.returns import network_created, stack_deleted, stack_outputs
from ultracluster.run.tags import RUN_ID_TAG
from ultracluster.triggers.kill_guard import should_delete_on_kill
from ultracluster.triggers.task_end import ending, task_success, warm_up

# Waiter name -> what a failure is called in the task log.
_FAILURES = {"stack_create_complete": "Stack creation failed", "stack_delete_complete": "Stack deletion failed"}


class CloudFormationStackTrigger(AwsBaseWaiterTrigger):
    """
    Wait for ``stack_create_complete`` or ``stack_delete_complete`` (botocore's waiters).

    Events (``run.events``): ``complete``; ``stack_failed`` (the waiter's failure state),
    ``timeout``, ``api_error``; each with ``stack_name``.

    :param owner_run_id: with ``delete_on_kill``, killing the waiting task deletes the stack, but
        only if its ``ultracluster:run-id`` tag is this run (a failed setup gets no teardown).
    :param end_task: a wait that succeeds ends its task here (``triggers.task_end``): create_vpc
        with ``run.returns.network_created`` (the stack's outputs), delete_vpc with
        ``run.returns.stack_deleted``. Any other end resumes the task on a worker.
    """

    aws_hook_class = NetworkStackHook

    def __init__(
        self,
        *,
        stack_name: str,
        waiter_name: str,
        waiter_delay: float = 15,
        waiter_max_attempts: int = 240,
        owner_run_id: str | None = None,
        delete_on_kill: bool = False,
        end_task: bool = False,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        if waiter_name not in _FAILURES:
            raise ValueError(f"waiter_name must be one of {sorted(_FAILURES)}, not {waiter_name!r}")
        super().__init__(
            serialized_fields={"stack_name": stack_name, "waiter_name": waiter_name,
                               "owner_run_id": owner_run_id, "delete_on_kill": delete_on_kill,
                               "end_task": end_task},
            waiter_name=waiter_name,
            waiter_args={"StackName": stack_name},
            failure_message=f"{_FAILURES[waiter_name]}: {stack_name}",
            status_message=f"Stack {stack_name}",
            status_queries=["Stacks[0].StackStatus", "Stacks[0].StackStatusReason"],
            return_key="stack_name",
            return_value=stack_name,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            aws_conn_id=aws_conn_id,
            **kwargs,
        )
        self.stack_name = stack_name
        self.owner_run_id = owner_run_id
        self.delete_on_kill = delete_on_kill
        self.end_task = end_task

    def _event_from_exception(self, error: Exception) -> TriggerEvent:
        if isinstance(error, WaiterTerminalFailure):
            reason = "stack_failed"
        elif isinstance(error, WaiterMaxAttemptsError) and "credentials" not in str(error):
            reason = "timeout"
        else:
            reason = "api_error"
        return TriggerEvent(event(reason, str(error), stack_name=self.stack_name))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_up(self, self.end_task)
        try:
            async for raised in super().run():
                if raised.payload.get("status") != "success":
                    yield raised  # built by _event_from_exception
                    continue
                done = TriggerEvent(event("complete", f"Stack {self.stack_name}: done", stack_name=self.stack_name))
                yield await self._task_end(done) if ending(self, done.payload, self.end_task) else done
        except Exception as error:  # an endpoint or credentials error: the task still cleans up
            self.log.exception("Waiting for stack %s failed", self.stack_name)
            yield self._event_from_exception(error)

    async def _task_end(self, done: TriggerEvent) -> TriggerEvent:
        if self.waiter_name == "stack_delete_complete":
            return await task_success(self, done, stack_deleted(self.stack_name))
        try:
            async with await self.hook().get_async_conn() as client:
                stack = (await client.describe_stacks(StackName=self.stack_name))["Stacks"][0]
        except Exception as error:  # the stack is there: the worker reads its outputs again
            self.log.warning("Reading stack %s's outputs failed (%s): the task resumes on a worker", self.stack_name,
                             error)
            return done
        return await task_success(self, done, network_created(self.stack_name, self.region_name, stack_outputs(stack)))

    async def on_kill(self) -> None:
        if not await should_delete_on_kill(self, self.stack_name):
            return
        hook = self.hook()
        async with await hook.get_async_conn() as client:
            try:
                stack = (await client.describe_stacks(StackName=self.stack_name))["Stacks"][0]
                owner = {t["Key"]: t["Value"] for t in stack.get("Tags") or []}.get(RUN_ID_TAG)
                if owner != self.owner_run_id:
                    self.log.info("on_kill: stack %s belongs to run %r: left alone", self.stack_name, owner)
                    return
                await client.delete_stack(StackName=self.stack_name)
                self.log.info("on_kill: deletion of stack %s started", self.stack_name)
            except Exception as error:  # best effort: the stack stays visible in the console link
                self.log.warning("on_kill: could not delete stack %s: %s", self.stack_name, error)
