"""The runners' room: the requests and faults the verbs share with every runner
(vocabulary), the drivers that perform them, the SDK runner and the wire runner."""
