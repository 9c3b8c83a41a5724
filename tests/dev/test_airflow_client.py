"""The DAG tests' client of Airflow's REST API (tests/support/airflow_api.py) on a loaded
machine: a request that fails on the way (the api-server answering after the client's
time-out) is asked again, by a wait up to its deadline, by a GET a bounded number of times;
an answer with an error status fails at once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.airflow_api import AirflowApi, poll


def test_a_request_that_times_out_while_polling_is_asked_again_until_the_deadline() -> None:
    """The api-server of a loaded machine may answer a request after the client's time-out:
    the wait goes on (its deadline decides), and a wait that ends in failures names them."""
    answers: list[Any] = [httpx.ReadTimeout("timed out"), httpx.ConnectError("refused"), "done"]

    def check() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert poll("the run", check, 5.0, interval_s=0.01) == "done"

    def never() -> Any:
        raise httpx.ReadTimeout("timed out")

    with pytest.raises(AssertionError, match=r"waiting for the run \(the last request "
                                             r"failed: ReadTimeout"):
        poll("the run", never, 0.05, interval_s=0.01)

    def refused() -> Any:  # an answer with an error status is no transport failure
        raise httpx.HTTPStatusError("404", request=httpx.Request("GET", "http://x"),
                                    response=httpx.Response(404))

    with pytest.raises(httpx.HTTPStatusError):
        poll("the run", refused, 5.0, interval_s=0.01)


def test_a_get_that_times_out_is_asked_again_a_bounded_number_of_times() -> None:
    answers: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answers.append(request.url.path)
        if len(answers) < AirflowApi.GET_TRIES:
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={"state": "success"})

    api = AirflowApi.__new__(AirflowApi)  # its client alone: no api-server to log in to
    api.client = httpx.Client(base_url="http://airflow/api/v2",
                              transport=httpx.MockTransport(handler))
    assert api.get("/dags/d/dagRuns/r") == {"state": "success"}
    assert len(answers) == AirflowApi.GET_TRIES

    def never(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    api.client = httpx.Client(base_url="http://airflow/api/v2",
                              transport=httpx.MockTransport(never))
    with pytest.raises(httpx.ReadTimeout):
        api.get("/dags/d/dagRuns/r")


def test_waiting_for_a_task_ends_when_it_fails_and_shows_its_log() -> None:
    """A task that failed is not waited for up to the deadline (a run on a loaded machine
    took the whole test's time-out so): the wait ends at once with the end of its log; a
    try that Airflow retries is no end."""
    states = ["running", "up_for_retry", "failed"]

    def handler(request: httpx.Request) -> httpx.Response:
        if "/logs/" in request.url.path:
            assert request.url.path.endswith("/plan/logs/2")
            assert request.url.params["map_index"] == "-1"
            return httpx.Response(200, json={"content": [
                {"level": "info", "event": "starting"},
                {"level": "error", "event": "the execution API did not answer"}]})
        state = states.pop(0) if len(states) > 1 else states[0]
        return httpx.Response(200, json={"task_instances": [
            {"task_id": "plan", "map_index": -1, "state": state, "try_number": 2}]})

    api = AirflowApi.__new__(AirflowApi)
    api.client = httpx.Client(base_url="http://airflow/api/v2",
                              transport=httpx.MockTransport(handler))
    with pytest.raises(AssertionError, match=r"plan of d run r did not succeed: map index -1 "
                                             r"failed \(try 2\), its log ends: info starting\n"
                                             r"error the execution API did not answer"):
        api.wait_for_task("d", "r", "plan", 30.0)
    assert states == ["failed"]

    states[:] = ["queued", "success"]
    api.wait_for_task("d", "r", "plan", 30.0)
    assert states == ["success"]
