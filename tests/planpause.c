/*
 * A module a test session LOADs (tests/planpause.py builds it against the server's headers): it stops the
 * planner of that session at one chosen moment, so that another session can commit something there, and a
 * race that otherwise needs the luck of a microsecond window runs the same way every time.
 *
 * The moment: the first time, after `SET planpause.advisory_key = K`, that the planner has planned the
 * source SELECT of an INSERT ... SELECT (the end of that subquery's set_rel_pathlist, the subquery being
 * planned and its expressions folded). There the session waits for the advisory lock K (as
 * pg_advisory_lock(K) takes it, then gives it back), which the other session holds while it works; then it
 * takes in the invalidations that arrived meanwhile, as it would at its next lock or catalog read, and
 * planning goes on: the rest of the statement is planned with what the other session committed. K is
 * cleared at the pause, so the next statements plan as usual.
 *
 * Nothing else changes: no plan, no cost, no result; without the setting the hook only passes through.
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "optimizer/paths.h"
#include "storage/lock.h"
#include "utils/guc.h"
#include "utils/inval.h"

PG_MODULE_MAGIC;

void _PG_init(void);

static set_rel_pathlist_hook_type previous_hook = NULL;
static int advisory_key = 0;

static void
pause_after_insert_source(PlannerInfo *root, RelOptInfo *rel, Index rti, RangeTblEntry *rte)
{
	if (previous_hook)
		previous_hook(root, rel, rti, rte);
	if (advisory_key > 0 && rte->rtekind == RTE_SUBQUERY && root->parse->commandType == CMD_INSERT)
	{
		LOCKTAG tag;
		int64 key = advisory_key;

		/* Once: cleared here, not through the GUC machinery (SHOW reads 0 from now on, as it should). */
		advisory_key = 0;
		/* pg_advisory_lock(bigint)'s tag */
		SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (key >> 32), (uint32) key, 1);
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
		LockRelease(&tag, ExclusiveLock, false);
		AcceptInvalidationMessages();
	}
}

void
_PG_init(void)
{
	DefineCustomIntVariable("planpause.advisory_key",
							"Advisory lock the next INSERT ... SELECT waits for, once its source is planned (0: none).",
							NULL, &advisory_key, 0, 0, INT_MAX, PGC_USERSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("planpause");
	previous_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = pause_after_insert_source;
}
