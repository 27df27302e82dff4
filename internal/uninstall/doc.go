// Package uninstall removes what gpud leaves on a node (the pinned gate,
// the state file, the control socket, the journal, checkpoint notices, the
// CDI specs of DRA claims no pod is prepared for, and the directories that
// held them) and, for `helm uninstall`, turns gpud's
// DaemonSet into cleaners and waits until every node is clean.
//
// Only files gpud writes are removed, by name, through internal/safefs
// (never through a symlink, only in directories only root can change);
// directories only when empty. An admin who pointed --state-dir at a
// directory shared with other things loses nothing but gpud's files.
package uninstall
