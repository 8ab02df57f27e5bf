"""Quality within a time budget (`bass eval humaneval`)."""
