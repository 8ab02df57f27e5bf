"""Where a benchmark ran: the commit it names, also on a machine that got the wheel without .git."""

from bass.app.bench.environment import BUILD_COMMIT_FILE, git_commit


def test_the_commit_comes_from_the_environment_then_the_checkout_then_the_wheels_record(tmp_path, monkeypatch):
    monkeypatch.delenv("BASS_COMMIT", raising=False)
    assert git_commit(tmp_path) == "unknown"  # not a checkout, nothing recorded
    (tmp_path / BUILD_COMMIT_FILE).write_text("9105783\n")
    assert git_commit(tmp_path) == "9105783"  # recorded beside the installed package
    monkeypatch.setenv("BASS_COMMIT", "bf423c1")
    assert git_commit(tmp_path) == "bf423c1"
    monkeypatch.delenv("BASS_COMMIT")
    checkout = git_commit()  # this package's own checkout wins over a recorded file
    assert checkout not in ("unknown", "9105783") and len(checkout.split("-")[0]) == 12
