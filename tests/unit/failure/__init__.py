"""Unit tests of the first death, ranks' records, node facts and words (`_failure`)."""
